// Float64 reference of BACKWARD context parallelism (DESIGN §1, "auto-CP" run backward in time),
// one (sequence, v-head) at a time: the algebra the GPU backward-CP kernels follow.
//
// Shapes: states and state gradients [K][V], forward transitions M [K][K], token rows [T][K] or
// [T][V], all row-major std::vector<double>. Chunks are those of forward_math.h (C = kChunk, a
// partial last chunk has n < C rows).
//
// Direction conventions. Segment j = 0..J-1 covers tokens [b_j, b_{j+1}) (b_J = T). S_j is the
// state ENTERING segment j (S_0 = h0) = the state LEAVING segment j-1. dS_j = ∂L/∂S_j, so
// dS_J = dS_T (the final-state gradient, zero when absent) and dS_0 = dh0. The forward affine map
// of segment j is S_{j+1} = S*_j + M_j S_j (affine_span); reverse mode through it gives
//     dS_j = dS*_j + M_jᵀ dS_{j+1}
// where dS*_j, the gradient w.r.t. S_j from segment j's own dO alone (dS_{j+1} = 0), does not
// depend on any state: the forward is affine in S, so the reverse dS chain is linear in (dO, dS).
//
// The dh-only chunk step (derived in cp_backward.cpp): with X' = A_r diag(β) K and
// R = Q − tril(Q Kᵀ) X' (both gate-free, tril incl. the diagonal),
//     dS_prev = e^γ (dS − X'ᵀ (K dS)) + scale · Rᵀ (Γ dO),      Mᵀ_chunk = e^γ (I − X'ᵀ K).
//
// The CP pipeline (cp_backward):
//   1. entering states S_j by the forward CP scan (cp_entering_states; windows as cp_forward);
//   2. per segment j >= 1 in parallel: n_j = leading_decay_window(gates of segment j); with a
//      window dS*_j from its first n_j chunks only (no M needed), else dS*_j over the whole
//      segment and M_j;
//   3. serial reverse scan j = J-1 .. 1: dS_j = dS*_j (+ M_jᵀ dS_{j+1} without a window);
//   4. per segment in parallel: the chunked backward (backward_chunked) of segment j from S_j with
//      dO of the segment and dS_{j+1}; its dS_0 for segment 0 is dh0.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/backward.h"
#include "reference/forward_math.h"

namespace flashgdn::reference::bwd {

// ---- the dh-only pass -------------------------------------------------------------------------

// One chunk: dS_prev (the gradient w.r.t. the state entering chunk r) from ds_next (w.r.t. the
// state leaving it; empty means zero) and the chunk's rows of d_o ([T][V] of the whole head; empty
// means zero).
std::vector<double> chunk_state_grad_step(const HeadInputs& head, ChunkRange r,
                                          const std::vector<double>& d_o,
                                          const std::vector<double>& ds_next);

// Chunks [c_begin, c_end) run in reverse from ds_end (the gradient w.r.t. the state leaving chunk
// c_end-1; empty means zero): the gradient w.r.t. the state entering chunk c_begin. With an empty
// ds_end this is dS* of the span.
std::vector<double> span_state_grad(const HeadInputs& head, const std::vector<double>& d_o,
                                    int64_t c_begin, int64_t c_end,
                                    const std::vector<double>& ds_end = {});

// The backward affine map of a span: dS_start = ds_star + mᵀ dS_end.
struct BackwardAffineMap {
  std::vector<double> ds_star;  // [K][V]: dS_start from the span's dO alone
  std::vector<double> m;        // [K][K]: the span's FORWARD transition (affine_span's m)
};
BackwardAffineMap backward_affine_span(const HeadInputs& head, const std::vector<double>& d_o,
                                       int64_t c_begin, int64_t c_end);

// mᵀ ds for m [K][K] and ds [K][V].
std::vector<double> transpose_times(const std::vector<double>& m, const std::vector<double>& ds,
                                    int K, int V);

// ---- the CP pipeline --------------------------------------------------------------------------

// The forward CP scan alone (cp_forward's phase 1): S_j for j = 0..J-1; forward_windowed[j] says
// S_{j+1} came from segment j's trailing decay window. segment_begins as for cp_forward.
std::vector<std::vector<double>> cp_entering_states(const HeadInputs& head,
                                                    const std::vector<int64_t>& segment_begins,
                                                    double threshold,
                                                    std::vector<bool>* forward_windowed = nullptr);

struct CpBackwardResult {
  HeadGrads grads;                                       // every token's gradients and ds0 = dh0
  std::vector<std::vector<double>> entering_states;       // S_j, j = 0..J-1 (as used)
  std::vector<std::vector<double>> entering_state_grads;  // dS_j, j = 0..J (dS_0 dh0, dS_J dS_T)
  std::vector<bool> windowed;          // per segment: dS_j came from a leading window (never j = 0)
  std::vector<bool> forward_windowed;  // per segment: S_{j+1} came from a trailing window
};

// Steps 2–4 from given entering states S_j (one per segment: exact ones or the forward scan's).
// d_o [T][V]; d_sT [K][V] or empty. `threshold` = the backward decay-window threshold (-infinity
// disables windows). Throws std::invalid_argument on bad segment_begins or entering states.
CpBackwardResult cp_backward_from_states(const HeadInputs& head, const std::vector<double>& d_o,
                                         const std::vector<double>& d_sT,
                                         const std::vector<int64_t>& segment_begins,
                                         const std::vector<std::vector<double>>& entering_states,
                                         double threshold);

// The whole pipeline: the entering states from cp_entering_states with the same threshold, then
// cp_backward_from_states.
CpBackwardResult cp_backward(const HeadInputs& head, const std::vector<double>& d_o,
                             const std::vector<double>& d_sT,
                             const std::vector<int64_t>& segment_begins, double threshold);

}  // namespace flashgdn::reference::bwd
