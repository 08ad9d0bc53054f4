// Internal: forward planning and launch with an explicit choice of variant (tests and benchmarks
// use it to compare the storage precision of the gate-free inverse).
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashgdn/flashgdn.h"
#include "kernels/sm90/launch.h"
#include "plan/cost_model.h"
#include "runtime/common.h"

namespace flashgdn::detail {

// Storage of A_r between the inverse and the fused kernel: bf16. Measured on the H200
// (test_inverse_storage_precision, bench/results/2026-11-29_gpu_tests.txt): o's relative error was
// 3.658e-3 with fp32 storage and 3.663e-3 with bf16 (weak gates), 3.2934e-3 and 3.2937e-3 (model
// gates): the difference is noise beside the bf16 GEMM operands, and bf16 halves A_r's traffic.
inline constexpr kern::InverseKind kDefaultInverse = kern::InverseKind::kBF16;

// Byte offsets of the workspace regions (256-byte aligned) and the total.
// Whether and how a pass cuts sequences into segments (context_parallelism, cp_plan.h), with the
// cost model of that pass (the forward's by default; the backward passes CostModel::backward()).
struct CpDecision {
  bool enabled = false;
  int64_t segment_chunks = 0;  // L
  int64_t max_segments = 0;    // exact with host lengths, else a bound
};
CpDecision decide_cp(const Inputs& in, const plan::CostModel& model = {});
// The cut of segment_chunks >= 1 chunks as given (the backward with the forward's CP cache), enabled.
CpDecision given_cp(const Inputs& in, int64_t segment_chunks);

// Sequences x v-heads that stay resident through a call without CP: the sequences' chunks over the
// longest one's, times Hv (N Hv at equal lengths); 0 without host lengths.
double resident_items(const Inputs& in);
// The cut of the shard phases (ShardPhase), which always run segments: the planner's (also when
// the caller turned CP off), else one segment per sequence.
CpDecision decide_shard_cp(const Inputs& in, const plan::CostModel& model = {});

// CTAs per (sequence or segment, v-head) of the fused forward: 2 (half of the value columns each)
// when even the doubled grid fits in one wave of the GPU's SMs, else 1.
int32_t choose_v_split(int64_t items, int32_t num_v_heads);

// Workspace regions of the CP forward (offsets from the workspace start).
struct CpRegions {
  std::size_t segment_offsets = 0;  // int32 [N + 1], varlen only
  std::size_t window_chunks = 0;    // int32 [segments, Hv]
  std::size_t segment_ends = 0, segment_transitions = 0, segment_starts = 0;  // fp32 [segments, Hv, 128, 128]
};
// Appends the regions at `offset` (aligned); returns the new end.
std::size_t add_cp_regions(const Inputs& in, const CpDecision& cp, std::size_t offset, CpRegions& regions);
// Where a varlen CP call's segment table goes (null without CP or varlen): prepare_inputs computes it
// with the chunk table, in one launch.
int32_t* cp_segment_offsets(const Inputs& in, const CpDecision& cp, const CpRegions& regions, unsigned char* workspace);
// Points p's CP fields at the regions.
void bind_cp(kern::ForwardParams& p, const Inputs& in, const CpDecision& cp, const CpRegions& regions,
             unsigned char* workspace);
// Which fused forward kernel runs: kAuto = auto_forward_kernel's choice with the bf16 inverse in
// forward_with, the wgmma kernel in launch_forward_passes (the mma.sync kernel when a V split is
// forced); kMmaSync = fused_forward.cuh (mma.sync, with its V split); kWgmma = the wgmma one;
// kWarpSpecialized = fused_forward_ws.cuh, kRegisterState = fused_forward_rs.cuh (the only one that
// writes chunk_states: the backward's pre-pass), kInverseInside = fused_forward_inv.cuh.
enum class FusedKernel : int32_t {
  kAuto = 0,
  kMmaSync = 1,
  kWgmma = 2,
  kWarpSpecialized = 3,
  kRegisterState = 4,
  kInverseInside = 5
};

// The fused forward kAuto takes with the bf16 inverse: v5 (the inverse inside) where no CP runs and
// the resident items fill 40% of the SMs, else v4 (register state). v4 pays the chunk inverse's pass
// (~13 ns a chunk and v-head, spread over every SM), v5 a longer chunk step on the longest item
// (~0.55 us a chunk more): v5 wins where resident items > ~46 on 132 SMs. Measured (bench/notes.md,
// session 24, whole calls rs / inv pinned, no CP): 1x2048 (16,48), 48 items: 126.6 / 126.5 us;
// 4x2048 (16,16), 64: 140.4 / 122.9; 1x1024+7168 (16,64), 73: 419.4 / 397.2; 4x2048 (8,24), 96:
// 144.5 / 125.4; 2x1024 (2,8), 16: 58.7 / 68.2 (v4 wins).
FusedKernel auto_forward_kernel(const Inputs& in, bool cp_enabled, ShardPhase phase);

// Which CP passes launch_forward_passes runs: all; up to the state pass and then the shard maps
// (ShardPhase::kMaps); up to the state pass (the backward's kMaps); from the correction on
// (ShardPhase::kFinish); with the segment states given (p.segment_starts_given, the backward with
// the forward's CP cache), the state pass's transitions only and the main pass.
enum class CpStages { kAll, kMaps, kStatePass, kFinish, kGivenStarts };

// The forward passes after chunk_inverse: without CP the fused kernel; with CP (bind_cp first) the
// windows, the state pass, the correction and the main pass (or the stages asked for). Each pass's
// kernel and V split are chosen here. chunk_states (the backward's pre-pass; kernel must be
// kRegisterState and p.o null) is written by the pass that runs whole sequences or segments from
// their true entering states.
Status launch_forward_passes(kern::ForwardParams& p, kern::ElemKind elem, kern::InverseKind inverse,
                             void* chunk_states, cudaStream_t stream, int32_t forced_v_split = 0,
                             FusedKernel kernel = FusedKernel::kAuto, CpStages stages = CpStages::kAll);

// Short sequences (decoding, speculative verification: at most kDecodeTokensPerSequence tokens per
// sequence on average, and none longer than kDecodeMaxTokens when the host knows the lengths; see
// api/validate.h) run token by token (recurrent_decode.cu) instead of in 64-token chunks.
bool use_recurrent_decode(const ForwardProblem& problem);

struct ForwardLayout {
  InputLayout inputs;        // chunk offsets, normalised q and k
  bool decode = false;       // use_recurrent_decode: no inverse, no CP
  std::size_t inverse = 0;   // A_r rows [B * T, Hv, 64]
  std::size_t chunk_gates = 0;  // gate records [chunk bound][Hv][128] fp32 (ForwardParams::chunk_gates)
  CpDecision cp;
  CpRegions cp_regions;
  std::size_t chunk_window_terms = 0;  // with CP: fp32 [chunk bound][Hv] (ForwardParams::chunk_window_terms)
  std::size_t checkpoint_offsets = 0;  // int32 [N + 1], varlen with checkpoints
  std::size_t bytes = 0;
};

// The workspace plan of the problem as forward_with runs it (equal-length packed sequences as batch
// mode: uniform_sequence_length in common.h).
ForwardLayout forward_layout(const ForwardProblem& problem, kern::InverseKind inverse);

// Whether a forward of this plan, fused kernel and inverse storage forms the chunk inverse the backward
// can take (the inverse cache) with the bf16 (fp16-merged) inverse: the register-state kernel (its chunk
// inverse writes the backward's bytes), or the inverse-inside kernel without CP (its kKeepsInverse build
// writes its own X and Ag: the same format, not the same bytes).
bool forms_reusable_inverse(const ForwardLayout& layout, FusedKernel kernel, kern::InverseKind inverse);

// Variants that measurements and tests pin (the public entry points use the defaults).
struct ForwardVariant {
  kern::InverseKind inverse = kDefaultInverse;
  int32_t v_split = 0;  // mma.sync fused kernel's V split: 0 = choose_v_split, else 1 or 2
  // kRegisterState also changes what the chunk inverse writes (Ag, gated): a shard's finish phase
  // must pin the kernel its maps phase pinned.
  FusedKernel kernel = FusedKernel::kAuto;
};

Status forward_with(const ForwardProblem& problem, const ForwardVariant& variant, void* workspace,
                    std::size_t workspace_bytes, cudaStream_t stream);

// FLASHGDN_TIMELINE builds: the device buffer, uint64 [2][kern::kTimelineChunks][kern::kTimelineEvents]
// (kernels/sm90/timeline.cuh), that forward_with's warp-specialized kernels record into from now on
// (null: none), and the backward's gradient pass too. Other builds: kNotSupported.
Status set_timeline(void* device_buffer);
// The buffer set_timeline took (null: none).
unsigned long long* timeline_buffer();

}  // namespace flashgdn::detail
