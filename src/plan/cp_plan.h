// Intra-card sequence parallelism (auto-CP, DESIGN §1): whether to cut long sequences into
// segments, and where.
//
// With CP, every segment runs from a zero state in parallel (S*, and M where a head needs it), a
// short serial scan per sequence fixes the true segment-entry states, and the fused kernel then
// runs all (segment, v-head) items in parallel. The cut costs an extra state pass, the scan and
// three launches; it pays off when (sequences x v-heads) leave SMs idle and a sequence is long.
//
// Segmentation for a target length of L chunks, the runtime's (locate_segment in the kernels'
// sequence.cuh): a sequence of C chunks gets n = ceil(C / L) segments of balanced sizes
// floor(C / n) or floor(C / n) + 1 chunks, the longer ones first; segments are contiguous,
// chunk-aligned, and the last ends at the sequence end (its last chunk may be partial). So a
// sequence of at most L chunks stays whole, and no segment is a short tail.
//
// Choice of L: the candidates are the cuts of the longest sequence into n = 2, 3, ... segments
// (L = ceil(C_max / n), never below min_segment_chunks: shorter segments do not keep the fused
// kernel's pipeline busy), up to the count whose segments fill 4 waves of the heavy kernels on
// their own; each candidate's time comes from the cost model (cost_model.h) and the fastest is
// kept. Under the one-wave model T = lambda_1 L + lambda_2 N / L this lands at L ~ sqrt(N); when
// the segments of all heads exceed a wave it stops where the average-load bound takes over.
// CP is turned on only when the modelled time is below (1 - min_relative_gain) times the modelled
// time without CP, so the planner never returns a plan the model says is slower than no CP.
//
// Decay windows are data-dependent (the gates live on the device) and unknown to the planner: it
// assumes `assumed_m_heads` v-heads need the exact M over whole segments and the others a
// window of `assumed_window_chunks` chunks. The default assumes every head needs M (heads with
// g == 0 do), the worst case, so the modelled gain holds whatever the gates are.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "plan/chunk_table.h"
#include "plan/cost_model.h"

namespace flashgdn::plan {

struct CpProblem {
  std::span<const int64_t> sequence_lengths;  // tokens per sequence (0 allowed)
  int32_t num_v_heads = 0;                    // Hv
  int32_t num_sms = 132;                      // H200
};

struct CpOptions {
  int64_t min_segment_chunks = 4;     // plan_cp: no target length L shorter than this, nor than
                                      // the cost model's min_segment_chunks
  double min_relative_gain = 0.05;    // CP only when modelled time <= (1 - gain) * no-CP time
  int32_t assumed_m_heads = -1;       // v-heads assumed to need exact M; -1: all of them
  int64_t assumed_window_chunks = 8;  // decay window of the other heads
};

struct Segment {
  int32_t sequence = 0;  // raw sequence index
  int32_t index = 0;     // segment index within its sequence (0 = first)
  int64_t offset = 0;    // first token, from the sequence start (a multiple of kChunkSize)
  int64_t tokens = 0;    // >= 1

  int64_t num_chunks() const { return num_chunks_of(tokens); }
};

struct CpPlan {
  bool enabled = false;               // some sequence is cut into more than one segment
  int64_t target_segment_chunks = 0;  // L of the split; 0 when CP is off
  int32_t num_v_heads = 0;
  int32_t num_sms = 0;
  int32_t assumed_m_heads = 0;  // resolved (never -1)
  int64_t assumed_window_chunks = 0;
  std::vector<int64_t> sequence_lengths;
  std::vector<Segment> segments;       // sequence-major, each sequence's segments in order
  std::vector<int64_t> first_segment;  // num_sequences + 1 CSR offsets into `segments`; an empty
                                       // sequence owns none, a sequence not cut owns one

  int64_t num_sequences() const { return static_cast<int64_t>(sequence_lengths.size()); }
  int64_t num_segments_of(int64_t sequence) const {
    return first_segment[sequence + 1] - first_segment[sequence];
  }
  // First token of each segment of `sequence`, from its start: {0, b_1, ..., b_{n-1}} (empty for
  // an empty sequence). The segment j ends where j + 1 begins, the last at the sequence length.
  std::vector<int64_t> segment_begins(int64_t sequence) const;
};

// The auto-CP decision and segmentation. Throws std::invalid_argument on a negative length,
// num_v_heads < 1, num_sms < 1, min_segment_chunks < 1, min_relative_gain outside [0, 1),
// assumed_m_heads outside [-1, num_v_heads], assumed_window_chunks < 0, or a cost model with a
// negative coefficient or a CTA / slice / minimum segment count below 1 (also checked by
// predict_time_us).
CpPlan plan_cp(const CpProblem& problem, const CostModel& model = {},
               const CpOptions& options = {});

// Segments of a sequence of `chunks` chunks for a target length of `segment_chunks` >= 1: the
// runtime's cut, ceil(chunks / segment_chunks) (header comment).
inline constexpr int64_t num_segments_of(int64_t chunks, int64_t segment_chunks) {
  return (chunks + segment_chunks - 1) / segment_chunks;
}

// The plan without CP: every non-empty sequence is one segment.
CpPlan no_cp_plan(const CpProblem& problem, const CpOptions& options = {});

// The segmentation for a target length of `segment_chunks` >= 1 chunks (header comment), whatever
// the model says of it.
CpPlan split_plan(const CpProblem& problem, int64_t segment_chunks, const CpOptions& options = {});

// State columns per CTA of the serial corrections (cp_correction, cp_grad_correction): 16 (8 CTAs a
// (sequence, v-head) state, half the shared-memory traffic a step of the 32-column slice) when all
// of them fit one wave of `num_sms` SMs, else 32 (4 CTAs a state).
inline constexpr int32_t correction_slice_cols(int64_t num_sequences, int32_t num_v_heads, int32_t num_sms) {
  return num_sequences * num_v_heads * 8 <= num_sms ? 16 : 32;
}

// Modelled time of running the forward (or, with backward coefficients, the backward) with this
// plan: the CP pipeline when some sequence is cut, the fused kernel alone otherwise.
double predict_time_us(const CpPlan& plan, const CostModel& model);

}  // namespace flashgdn::plan
