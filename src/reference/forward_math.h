// The float64 forms of the GDN forward for one (sequence, v-head), DESIGN §1. All matrices are
// row-major std::vector<double>; states are [K][V].
//
// (a) Token recurrence (the oracle):
//         S_t = e^{g_t} (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = scale * S_t^T q_t
// (b) Chunked form, chunk C = 64 (a partial last chunk has n < C rows and uses only those): g_s the
//     inclusive cumsum of the chunk's gates, gamma = g_{n-1}, Gam = diag(e^{g_s}),
//     rho_s = e^{gamma - g_s}, G[s,t] = e^{g_s - g_t} (s >= t, else 0),
//         A_r = (I + StrictLower(diag(b) K K^T))^{-1}      (gate-free; G ⊙ A_r is the gated inverse)
//         W   = V - Gam (K S)        Vd = (G ⊙ A_r ⊙ 1 b^T) W
//         O   = scale (Gam (Q S) + (G ⊙ Q K^T) Vd)           S' = e^gamma S + K^T (rho ⊙ Vd)
// (c) Affine chunk map: X = -diag(b) A_r^T K,  S' = e^gamma (I + X^T K) S - X^T diag(rho) V, so a
//     span of chunks maps S_start to S_end = S* + M S_start.
// CP: segments of a sequence run from zero, a serial scan fixes their entering states (with
//     decay windows replacing M where a segment's trailing chunks decay below a threshold), then
//     every segment runs the chunked form from its fixed state.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flashgdn/problem.h"
#include "plan/decay_window.h"
#include "reference/core.h"

namespace flashgdn::reference {

// ---- (a) token recurrence ---------------------------------------------------------------------

HeadOutputs recurrent_forward(const HeadInputs& head);

// Tokens [begin, end) of `head`, entering with state `s0` ([K][V]).
HeadInputs slice_tokens(const HeadInputs& head, int64_t begin, int64_t end,
                        std::vector<double> s0);

// ---- (b) chunked form -------------------------------------------------------------------------

// Chunk c of a head covers tokens [c*kChunk, min((c+1)*kChunk, T)).
struct ChunkRange {
  int64_t begin = 0;  // first token
  int n = 0;          // valid rows (kChunk except possibly for the last chunk)
};
int64_t num_chunks(int64_t T);
ChunkRange chunk_range(const HeadInputs& head, int64_t c);

// g_s, the inclusive cumsum of the chunk's gates: [n].
std::vector<double> chunk_gate_cumsum(const HeadInputs& head, ChunkRange r);
// A_r = (I + StrictLower(diag(b) K K^T))^{-1}, unit lower-triangular: [n][n].
std::vector<double> chunk_a_r(const HeadInputs& head, ChunkRange r);
// X = -diag(b) A_r^T K: [n][K].
std::vector<double> chunk_x(const HeadInputs& head, ChunkRange r);

// Everything one chunk step produces from the entering state s ([K][V]).
struct ChunkStep {
  std::vector<double> a_r;     // [n][n]
  std::vector<double> v_new;   // Vd: [n][V]
  std::vector<double> o;       // O:  [n][V]
  std::vector<double> s_next;  // S': [K][V]
};
ChunkStep chunk_step(const HeadInputs& head, ChunkRange r, const std::vector<double>& s);
// Vd in the WY form of the warp-specialized kernel (fused_forward_ws.cuh):
//   Vd = Ag V - W~ S,  Ag = G (.) A_r (.) 1 b^T,  W~ = (Gam A_r diag(b)) K   ([n][V], = ChunkStep::v_new).
std::vector<double> chunk_vd_wy(const HeadInputs& head, ChunkRange r, const std::vector<double>& s);

// The whole head, chunk after chunk from head.s0.
HeadOutputs chunked_forward(const HeadInputs& head);

// ---- (c) affine chunk map ---------------------------------------------------------------------

// S_end = s_star + m * S_start.
struct AffineMap {
  std::vector<double> s_star;  // [K][V]: the end state from a zero entering state
  std::vector<double> m;       // [K][K]: the linear part
};
// One chunk: s_star = -X^T diag(rho) V, m = e^gamma (I + X^T K).
AffineMap chunk_affine(const HeadInputs& head, ChunkRange r);
// Chunks [c_begin, c_end) composed (an empty span gives s_star = 0, m = I).
AffineMap affine_span(const HeadInputs& head, int64_t c_begin, int64_t c_end);
// The end state of chunks [c_begin, c_end) run from a zero state (S* alone, no M formed).
std::vector<double> zero_start_state(const HeadInputs& head, int64_t c_begin, int64_t c_end);

// ---- CP pipeline ------------------------------------------------------------------------------

struct CpForwardResult {
  HeadOutputs out;
  std::vector<bool> windowed;  // per segment: its exit state came from a decay window (no M)
};
// `segment_begins`: first token of each segment, starting at 0, strictly increasing, multiples of
// kChunk, each < T (segment j ends where j+1 begins, the last at T). `threshold`: the decay-window
// threshold (-infinity disables windows). Throws std::invalid_argument on bad segment_begins.
CpForwardResult cp_forward(const HeadInputs& head, const std::vector<int64_t>& segment_begins,
                           double threshold);

// Throws std::invalid_argument("<caller>: segment_begins ...") unless segment_begins is a valid
// segmentation of head's tokens as described above.
void check_segment_begins(const HeadInputs& head, const std::vector<int64_t>& segment_begins,
                          const char* caller);

// ---- the public entry with a chosen form (for tests) -------------------------------------------

enum class ForwardForm { kRecurrent, kChunked, kContextParallel };
struct ForwardFormOptions {
  ForwardForm form = ForwardForm::kRecurrent;
  int64_t cp_segment_chunks = 2;  // kContextParallel: chunks per segment (>= 1)
  double cp_threshold = plan::kDefaultDecayThreshold;
};
// reference::forward, computing each (sequence, v-head) with the chosen form.
Status forward_in_form(const ForwardProblem& problem, const ForwardFormOptions& options);

}  // namespace flashgdn::reference
