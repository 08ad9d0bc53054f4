// Float64 reference backward, token level: the oracle every other backward is checked against.
//
// Forward, per token t (S row-major [K][V], k_t, q_t in R^K, v_t in R^V):
//     Sd_t = e^{g_t} S_{t−1}
//     r_t  = v_t − Sd_tᵀ k_t                        [V]
//     S_t  = Sd_t + β_t k_t r_tᵀ                     [K,V]
//     o_t  = s · S_tᵀ q_t                            [V]
//
// Reverse, t = T−1 … 0, carrying dS = ∂L/∂S_t from the future (dS = dS_T at the start, or 0):
//     dŜ    = dS + s q_t dO_tᵀ                       [K,V]  total gradient of S_t
//     dq_t  = s S_t dO_t                             [K]
//     dβ_t  = k_tᵀ dŜ r_t
//     dr    = β_t dŜᵀ k_t                            [V]
//     dv_t  = dr
//     dk_t  = β_t dŜ r_t − Sd_t dr                   [K]
//     dSd   = dŜ − k_t drᵀ                           [K,V]
//     dg_t  = ⟨dSd, Sd_t⟩  (Frobenius)               (w.r.t. the raw gate: ∂Sd/∂g = Sd)
//     dS    = e^{g_t} dSd                            → ∂L/∂S_{t−1};  dS_0 after token 0.
//
// Tape: the state entering every kChunk-th token is kept; the reverse sweep recomputes the states
// of one block of kChunk tokens from its checkpoint, so memory is O((T/kChunk + kChunk)·K·V).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/backward.h"

namespace flashgdn::reference::bwd {
namespace {

// One token step in place: S ← S_t, given S = S_{t−1}. Writes r_t into r when non-null.
void token_step(const HeadInputs& h, int64_t t, std::vector<double>& S, double* r) {
  const int K = h.K, V = h.V;
  const double decay = std::exp(h.g[t]);
  const double* k = &h.k[t * K];
  const double* v = &h.v[t * V];
  for (double& x : S) x *= decay;
  std::vector<double> rr(v, v + V);
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < V; ++j) rr[j] -= S[i * V + j] * k[i];
  const double b = h.beta[t];
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < V; ++j) S[i * V + j] += b * k[i] * rr[j];
  if (r) std::copy(rr.begin(), rr.end(), r);
}

std::vector<double> entering_state(const HeadInputs& h) {
  const size_t kv = static_cast<size_t>(h.K) * h.V;
  if (h.s0.size() == kv) return h.s0;
  return std::vector<double>(kv, 0.0);
}

}  // namespace

HeadOutputs forward_tokens(const HeadInputs& h) {
  const int K = h.K, V = h.V;
  HeadOutputs out;
  out.o.assign(static_cast<size_t>(h.T) * V, 0.0);
  std::vector<double> S = entering_state(h);
  for (int64_t t = 0; t < h.T; ++t) {
    token_step(h, t, S, nullptr);
    const double* q = &h.q[t * K];
    double* o = &out.o[t * V];
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < V; ++j) o[j] += h.scale * S[i * V + j] * q[i];
  }
  out.s_final = std::move(S);
  return out;
}

HeadGrads backward_tokens(const HeadInputs& h, const std::vector<double>& d_o,
                          const std::vector<double>& d_sT) {
  const int K = h.K, V = h.V;
  const int64_t T = h.T;
  const size_t kv = static_cast<size_t>(K) * V;
  HeadGrads gr;
  gr.dq.assign(static_cast<size_t>(T) * K, 0.0);
  gr.dk.assign(static_cast<size_t>(T) * K, 0.0);
  gr.dv.assign(static_cast<size_t>(T) * V, 0.0);
  gr.dg.assign(static_cast<size_t>(T), 0.0);
  gr.dbeta.assign(static_cast<size_t>(T), 0.0);

  // Forward: checkpoints of the state entering tokens 0, C, 2C, ...
  const int64_t num_blocks = (T + kChunk - 1) / kChunk;
  std::vector<std::vector<double>> checkpoints;
  checkpoints.reserve(static_cast<size_t>(num_blocks));
  std::vector<double> S = entering_state(h);
  for (int64_t t = 0; t < T; ++t) {
    if (t % kChunk == 0) checkpoints.push_back(S);
    token_step(h, t, S, nullptr);
  }

  std::vector<double> dS = d_sT.size() == kv ? d_sT : std::vector<double>(kv, 0.0);
  std::vector<double> Sd(kv), dSh(kv), r(V), dr(V);
  for (int64_t blk = num_blocks - 1; blk >= 0; --blk) {
    const int64_t t0 = blk * kChunk, t1 = std::min(T, t0 + kChunk);
    // States entering each token of the block: states[t − t0] = S_{t−1}.
    std::vector<std::vector<double>> states;
    states.reserve(static_cast<size_t>(t1 - t0));
    S = checkpoints[static_cast<size_t>(blk)];
    for (int64_t t = t0; t < t1; ++t) {
      states.push_back(S);
      token_step(h, t, S, nullptr);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const std::vector<double>& Sprev = states[static_cast<size_t>(t - t0)];
      const double decay = std::exp(h.g[t]);
      const double b = h.beta[t];
      const double* q = &h.q[t * K];
      const double* k = &h.k[t * K];
      const double* v = &h.v[t * V];
      const double* dO = &d_o[t * V];
      // Recompute Sd, r, S_t.
      for (size_t i = 0; i < kv; ++i) Sd[i] = decay * Sprev[i];
      for (int j = 0; j < V; ++j) r[j] = v[j];
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < V; ++j) r[j] -= Sd[i * V + j] * k[i];
      // dŜ = dS + s q dOᵀ;  dq = s S_t dO  (S_t = Sd + β k rᵀ)
      for (int i = 0; i < K; ++i) {
        double acc = 0.0;
        for (int j = 0; j < V; ++j) {
          const double St = Sd[i * V + j] + b * k[i] * r[j];
          acc += St * dO[j];
          dSh[i * V + j] = dS[i * V + j] + h.scale * q[i] * dO[j];
        }
        gr.dq[t * K + i] = h.scale * acc;
      }
      // dβ = kᵀ dŜ r;  dr = β dŜᵀ k
      double dbeta = 0.0;
      std::fill(dr.begin(), dr.end(), 0.0);
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < V; ++j) {
          dbeta += k[i] * dSh[i * V + j] * r[j];
          dr[j] += dSh[i * V + j] * k[i];
        }
      for (int j = 0; j < V; ++j) dr[j] *= b;
      gr.dbeta[t] = dbeta;
      for (int j = 0; j < V; ++j) gr.dv[t * V + j] = dr[j];
      // dk = β dŜ r − Sd dr
      for (int i = 0; i < K; ++i) {
        double acc = 0.0;
        for (int j = 0; j < V; ++j) acc += b * dSh[i * V + j] * r[j] - Sd[i * V + j] * dr[j];
        gr.dk[t * K + i] = acc;
      }
      // dSd = dŜ − k drᵀ;  dg = ⟨dSd, Sd⟩;  dS_{t−1} = e^g dSd
      double dg = 0.0;
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < V; ++j) {
          const double dSd = dSh[i * V + j] - k[i] * dr[j];
          dg += dSd * Sd[i * V + j];
          dS[i * V + j] = decay * dSd;
        }
      gr.dg[t] = dg;
    }
  }
  gr.ds0 = std::move(dS);
  return gr;
}

std::vector<double> l2_normalize_rows_backward(const std::vector<double>& x,
                                               const std::vector<double>& dxhat, int dim) {
  std::vector<double> dx(x.size(), 0.0);
  const size_t rows = dim > 0 ? x.size() / static_cast<size_t>(dim) : 0;
  for (size_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * dim];
    const double* dyr = &dxhat[r * dim];
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const double inv = 1.0 / std::sqrt(ss + kL2NormEps);
    double dot = 0.0;  // x̂·dx̂
    for (int i = 0; i < dim; ++i) dot += xr[i] * inv * dyr[i];
    for (int i = 0; i < dim; ++i) dx[r * dim + i] = (dyr[i] - xr[i] * inv * dot) * inv;
  }
  return dx;
}

}  // namespace flashgdn::reference::bwd
