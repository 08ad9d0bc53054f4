// Backward context parallelism in float64 (declarations and direction conventions in
// cp_backward.h). Shapes per chunk of n rows: Q, K [n][K]; dO [n][V]; β, g [n]; states and their
// gradients [K][V]; M [K][K]. s = scale.
//
// ── The dh-only chunk step, derived.
// For fixed (Q, K, V, β, g) a chunk's forward (forward_math.h (b)) is affine in its entering
// state S:
//     S' = e^γ S + Kᵀ diag(ρ) Ag (V − Γ K S)          O = s Γ Q S + Pg Ag (V − Γ K S)
// with Ag = G ⊙ A_r ⊙ 1βᵀ and Pg = s (G ⊙ Q Kᵀ) (both lower-triangular incl. the diagonal).
// Reverse mode w.r.t. S only, given dS = ∂L/∂S' and dO:
//     dS_prev = e^γ dS − Kᵀ Γ Agᵀ diag(ρ) K dS + s Qᵀ Γ dO − Kᵀ Γ Agᵀ Pgᵀ dO
// (the same as backward_chunked.cpp's e^γ dS + Kᵀ dU + s Qᵀ Γ dO with dU = −Γ Agᵀ dVd).
// Gate extraction: for a lower-triangular L (incl. the diagonal) G ⊙ L = Γ L Γ⁻¹, hence
// Ag = Γ A_r diag(β) Γ⁻¹ and Pg = s Γ tril(Q Kᵀ) Γ⁻¹; with Γ diag(ρ) = e^γ I:
//     Kᵀ Γ Agᵀ diag(ρ) K = e^γ Kᵀ diag(β) A_rᵀ K = e^γ X'ᵀ K,           X' = A_r diag(β) K   [n][K]
//     Kᵀ Γ Agᵀ Pgᵀ       = s Kᵀ diag(β) A_rᵀ tril(Q Kᵀ)ᵀ Γ = s (tril(Q Kᵀ) X')ᵀ Γ
// so, with R = Q − tril(Q Kᵀ) X' [n][K]:
//     dS_prev = e^γ (dS − X'ᵀ (K dS)) + s Rᵀ (Γ dO)
// X' and R are gate-free (no exponential, computed once per chunk); the only gates are e^γ and
// the row factors Γ = diag(e^{g_s}) on dO: exponentials of non-positive arguments, no Γ⁻¹ and no G.
// (Keeping G inside R, i.e. R = Q − tril(Q Kᵀ ⊙ G) X', would be right only with the gated
// X'_g = Ag Γ K = Γ X' in place of X': Γ R = Γ Q − (G ⊙ Q Kᵀ)(Ag Γ K).)
// The linear part is the transpose of the forward chunk map: with X = −diag(β) A_rᵀ K
// (forward_math.h (c)), Xᵀ K = −Kᵀ X', so (e^γ (I + Xᵀ K))ᵀ = e^γ (I − X'ᵀ K) = Mᵀ_chunk.
//
// ── A span of chunks, run in reverse from its exit gradient dS_end, composes to
//     dS_start = dS* + Mᵀ dS_end,   M = M_last ⋯ M_first (affine_span's m), dS* from dS_end = 0.
//
// ── Backward decay window: if the first n chunks of segment j have gate sum D <= threshold, then
// M_j = M_rest M_lead with ‖M_lead‖₂ <= e^D (unit keys, β in (0,1]) and
//     dS_j = dS*_lead + M_leadᵀ D_mid,   D_mid = ∂L/∂(state leaving those n chunks),
// so dS_j ≈ dS*_lead (the first n chunks run in reverse from zero) within e^D ‖D_mid‖_F, and
// neither M_j nor dS_{j+1} is needed. A windowed dS_j does not depend on dS_{j+1}, so window errors
// do not accumulate; without a window, errors pass through M_jᵀ, which does not expand them.
#include "reference/cp_backward.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "plan/decay_window.h"

namespace flashgdn::reference::bwd {
namespace {

using Mat = std::vector<double>;

Mat zeros(size_t n) { return Mat(n, 0.0); }

int64_t segment_end(const HeadInputs& head, const std::vector<int64_t>& begins, size_t j) {
  return j + 1 < begins.size() ? begins[j + 1] : head.T;
}

// Chunks of segment j: [first, last) (the last one possibly partial).
int64_t first_chunk(int64_t begin) { return begin / kChunk; }
int64_t end_chunk(int64_t end) { return (end + kChunk - 1) / kChunk; }

}  // namespace

std::vector<double> chunk_state_grad_step(const HeadInputs& head, ChunkRange r,
                                          const std::vector<double>& d_o,
                                          const std::vector<double>& ds_next) {
  const int n = r.n, K = head.K, V = head.V;
  const double* q = &head.q[r.begin * K];
  const double* k = &head.k[r.begin * K];
  const double* beta = &head.beta[r.begin];
  const std::vector<double> g_cum = chunk_gate_cumsum(head, r);
  const double gamma = g_cum[n - 1];
  const Mat a_r = chunk_a_r(head, r);

  // X'[t] = Σ_{s<=t} A_r[t,s] β_s k_s
  Mat xp = zeros(static_cast<size_t>(n) * K);
  for (int t = 0; t < n; ++t)
    for (int s = 0; s <= t; ++s) {
      const double coef = a_r[t * n + s] * beta[s];
      for (int i = 0; i < K; ++i) xp[t * K + i] += coef * k[s * K + i];
    }

  Mat ds_prev = zeros(static_cast<size_t>(K) * V);
  // e^γ (dS − X'ᵀ (K dS))
  if (!ds_next.empty()) {
    Mat kds = zeros(static_cast<size_t>(n) * V);  // K dS
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < K; ++i) {
        const double x = k[t * K + i];
        for (int j = 0; j < V; ++j) kds[t * V + j] += x * ds_next[i * V + j];
      }
    ds_prev = ds_next;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < K; ++i) {
        const double x = xp[t * K + i];
        for (int j = 0; j < V; ++j) ds_prev[i * V + j] -= x * kds[t * V + j];
      }
    const double chunk_decay = std::exp(gamma);
    for (double& x : ds_prev) x *= chunk_decay;
  }
  // + s Rᵀ (Γ dO),  R[t] = q_t − Σ_{s<=t} (q_t · k_s) X'[s]
  if (!d_o.empty()) {
    const double* d_o_rows = &d_o[r.begin * V];
    std::vector<double> row(K);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < K; ++i) row[i] = q[t * K + i];
      for (int s = 0; s <= t; ++s) {
        double qk = 0.0;
        for (int i = 0; i < K; ++i) qk += q[t * K + i] * k[s * K + i];
        for (int i = 0; i < K; ++i) row[i] -= qk * xp[s * K + i];
      }
      const double coef = head.scale * std::exp(g_cum[t]);
      for (int i = 0; i < K; ++i) {
        const double x = coef * row[i];
        for (int j = 0; j < V; ++j) ds_prev[i * V + j] += x * d_o_rows[t * V + j];
      }
    }
  }
  return ds_prev;
}

std::vector<double> span_state_grad(const HeadInputs& head, const std::vector<double>& d_o,
                                    int64_t c_begin, int64_t c_end,
                                    const std::vector<double>& ds_end) {
  Mat ds = ds_end.empty() ? zeros(static_cast<size_t>(head.K) * head.V) : ds_end;
  for (int64_t c = c_end - 1; c >= c_begin; --c)
    ds = chunk_state_grad_step(head, chunk_range(head, c), d_o, ds);
  return ds;
}

BackwardAffineMap backward_affine_span(const HeadInputs& head, const std::vector<double>& d_o,
                                       int64_t c_begin, int64_t c_end) {
  return {span_state_grad(head, d_o, c_begin, c_end), affine_span(head, c_begin, c_end).m};
}

std::vector<double> transpose_times(const std::vector<double>& m, const std::vector<double>& ds,
                                    int K, int V) {
  Mat out = zeros(static_cast<size_t>(K) * V);
  for (int l = 0; l < K; ++l)
    for (int i = 0; i < K; ++i) {
      const double x = m[l * K + i];  // (mᵀ)[i][l]
      for (int j = 0; j < V; ++j) out[i * V + j] += x * ds[l * V + j];
    }
  return out;
}

std::vector<std::vector<double>> cp_entering_states(const HeadInputs& head,
                                                    const std::vector<int64_t>& segment_begins,
                                                    double threshold,
                                                    std::vector<bool>* forward_windowed) {
  check_segment_begins(head, segment_begins, "cp_backward");
  const int K = head.K, V = head.V;
  const size_t num_segments = segment_begins.size();
  std::vector<bool> windowed(num_segments, false);
  std::vector<std::vector<double>> states;
  if (num_segments > 0)
    states.push_back(head.s0.empty() ? zeros(static_cast<size_t>(K) * V) : head.s0);
  for (size_t j = 0; j + 1 < num_segments; ++j) {
    const int64_t begin = segment_begins[j], end = segment_end(head, segment_begins, j);
    const int64_t c_begin = first_chunk(begin), c_end = end_chunk(end);
    const std::span<const double> gates(head.g.data() + begin, static_cast<size_t>(end - begin));
    if (const auto window = plan::trailing_decay_window(gates, kChunk, threshold)) {
      windowed[j] = true;
      states.push_back(zero_start_state(head, c_end - *window, c_end));
    } else {
      const AffineMap map = affine_span(head, c_begin, c_end);
      Mat next = map.s_star;
      const Mat& s = states.back();
      for (int i = 0; i < K; ++i)
        for (int l = 0; l < K; ++l) {
          const double x = map.m[i * K + l];
          for (int c = 0; c < V; ++c) next[i * V + c] += x * s[l * V + c];
        }
      states.push_back(std::move(next));
    }
  }
  if (forward_windowed) *forward_windowed = std::move(windowed);
  return states;
}

CpBackwardResult cp_backward_from_states(const HeadInputs& head, const std::vector<double>& d_o,
                                         const std::vector<double>& d_sT,
                                         const std::vector<int64_t>& segment_begins,
                                         const std::vector<std::vector<double>>& entering_states,
                                         double threshold) {
  check_segment_begins(head, segment_begins, "cp_backward");
  const int K = head.K, V = head.V;
  const size_t kv = static_cast<size_t>(K) * V;
  const size_t num_segments = segment_begins.size();
  if (entering_states.size() != num_segments)
    throw std::invalid_argument("cp_backward: need one entering state per segment");
  for (const Mat& s : entering_states)
    if (s.size() != kv) throw std::invalid_argument("cp_backward: entering states must be [K][V]");
  if (d_o.size() != static_cast<size_t>(head.T) * V)
    throw std::invalid_argument("cp_backward: d_o must be [T][V]");
  if (!d_sT.empty() && d_sT.size() != kv)
    throw std::invalid_argument("cp_backward: d_sT must be [K][V] or empty");

  CpBackwardResult result;
  result.entering_states = entering_states;
  result.windowed.assign(num_segments, false);
  result.forward_windowed.assign(num_segments, false);
  std::vector<Mat>& ds = result.entering_state_grads;
  ds.assign(num_segments + 1, Mat());
  ds[num_segments] = d_sT.empty() ? zeros(kv) : d_sT;

  // Phase 2 (parallel over segments j >= 1): dS*_j, from a leading window or with M_j.
  std::vector<BackwardAffineMap> maps(num_segments);
  for (size_t j = 1; j < num_segments; ++j) {
    const int64_t begin = segment_begins[j], end = segment_end(head, segment_begins, j);
    const int64_t c_begin = first_chunk(begin), c_end = end_chunk(end);
    const std::span<const double> gates(head.g.data() + begin, static_cast<size_t>(end - begin));
    if (const auto window = plan::leading_decay_window(gates, kChunk, threshold)) {
      result.windowed[j] = true;
      maps[j].ds_star = span_state_grad(head, d_o, c_begin, c_begin + *window);
    } else {
      maps[j] = backward_affine_span(head, d_o, c_begin, c_end);
    }
  }
  // Phase 3 (serial, last segment first): dS_j = dS*_j (+ M_jᵀ dS_{j+1}).
  for (size_t j = num_segments; j-- > 1;) {
    ds[j] = maps[j].ds_star;
    if (!result.windowed[j]) {
      const Mat carried = transpose_times(maps[j].m, ds[j + 1], K, V);
      for (size_t e = 0; e < kv; ++e) ds[j][e] += carried[e];
    }
  }
  // Phase 4 (parallel over segments): the chunked backward of each segment from (S_j, dS_{j+1}).
  HeadGrads& gr = result.grads;
  gr.dq.assign(static_cast<size_t>(head.T) * K, 0.0);
  gr.dk.assign(static_cast<size_t>(head.T) * K, 0.0);
  gr.dv.assign(static_cast<size_t>(head.T) * V, 0.0);
  gr.dg.assign(static_cast<size_t>(head.T), 0.0);
  gr.dbeta.assign(static_cast<size_t>(head.T), 0.0);
  for (size_t j = 0; j < num_segments; ++j) {
    const int64_t begin = segment_begins[j], end = segment_end(head, segment_begins, j);
    const HeadInputs part = slice_tokens(head, begin, end, entering_states[j]);
    const Mat part_d_o(d_o.begin() + begin * V, d_o.begin() + end * V);
    HeadGrads g = backward_chunked(part, part_d_o, ds[j + 1]);
    std::copy(g.dq.begin(), g.dq.end(), gr.dq.begin() + begin * K);
    std::copy(g.dk.begin(), g.dk.end(), gr.dk.begin() + begin * K);
    std::copy(g.dv.begin(), g.dv.end(), gr.dv.begin() + begin * V);
    std::copy(g.dg.begin(), g.dg.end(), gr.dg.begin() + begin);
    std::copy(g.dbeta.begin(), g.dbeta.end(), gr.dbeta.begin() + begin);
    if (j == 0) ds[0] = std::move(g.ds0);
  }
  gr.ds0 = ds[0];  // (T == 0: no segments, ds[0] is dS_T)
  return result;
}

CpBackwardResult cp_backward(const HeadInputs& head, const std::vector<double>& d_o,
                             const std::vector<double>& d_sT,
                             const std::vector<int64_t>& segment_begins, double threshold) {
  std::vector<bool> forward_windowed;
  const std::vector<std::vector<double>> states =
      cp_entering_states(head, segment_begins, threshold, &forward_windowed);
  CpBackwardResult result =
      cp_backward_from_states(head, d_o, d_sT, segment_begins, states, threshold);
  result.forward_windowed = std::move(forward_windowed);
  return result;
}

}  // namespace flashgdn::reference::bwd
