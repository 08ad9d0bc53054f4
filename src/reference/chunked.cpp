// The chunked form of DESIGN §1 with gate extraction, chunk C = 64. Per chunk of n valid rows:
//     g_s = cumsum of the gates, gamma = g_{n-1}, G[s,t] = e^{g_s - g_t} (s >= t),
//     rho_s = e^{gamma - g_s}
//     A_r = (I + StrictLower(diag(b) K K^T))^{-1}          (forward substitution, no exponential)
//     W   = V - Gam (K S)                Vd[s] = sum_{t<=s} G[s,t] A_r[s,t] b_t W[t]
//     O[s] = scale (e^{g_s} q_s^T S + sum_{t<=s} G[s,t] (q_s . k_t) Vd[t])
//     S'  = e^gamma S + sum_t rho_t k_t Vd[t]^T
// and Vd in the WY form of the warp-specialized kernel (chunk_vd_wy):
//     Vd = (G (.) A_r (.) 1 b^T) V - (Gam A_r diag(b)) K S
#include <algorithm>
#include <cmath>

#include "reference/forward_math.h"

namespace flashgdn::reference {
namespace {

double dot(const double* a, const double* b, int n) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// rows ([n][K]) times S ([K][V]): [n][V].
std::vector<double> rows_times_state(const double* rows, int n, const std::vector<double>& S,
                                     int K, int V) {
  std::vector<double> out(static_cast<size_t>(n) * V, 0.0);
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < K; ++i) {
      const double x = rows[s * K + i];
      for (int j = 0; j < V; ++j) out[s * V + j] += x * S[i * V + j];
    }
  return out;
}

}  // namespace

int64_t num_chunks(int64_t T) { return (T + kChunk - 1) / kChunk; }

ChunkRange chunk_range(const HeadInputs& head, int64_t c) {
  const int64_t begin = c * kChunk;
  return {begin, static_cast<int>(std::min<int64_t>(kChunk, head.T - begin))};
}

std::vector<double> chunk_gate_cumsum(const HeadInputs& head, ChunkRange r) {
  std::vector<double> g_cum(r.n);
  double sum = 0.0;
  for (int s = 0; s < r.n; ++s) g_cum[s] = sum += head.g[r.begin + s];
  return g_cum;
}

std::vector<double> chunk_a_r(const HeadInputs& head, ChunkRange r) {
  const int n = r.n, K = head.K;
  const double* k = &head.k[r.begin * K];
  const double* beta = &head.beta[r.begin];
  // L = I + StrictLower(diag(b) K K^T); row s of L A = e_s gives
  // A[s][t] = delta_{st} - sum_{t<=m<s} L[s][m] A[m][t].
  std::vector<double> lower(static_cast<size_t>(n) * n, 0.0);
  for (int s = 0; s < n; ++s)
    for (int m = 0; m < s; ++m) lower[s * n + m] = beta[s] * dot(&k[s * K], &k[m * K], K);
  std::vector<double> a(static_cast<size_t>(n) * n, 0.0);
  for (int s = 0; s < n; ++s) {
    a[s * n + s] = 1.0;
    for (int t = 0; t < s; ++t) {
      double sum = 0.0;
      for (int m = t; m < s; ++m) sum += lower[s * n + m] * a[m * n + t];
      a[s * n + t] = -sum;
    }
  }
  return a;
}

std::vector<double> chunk_x(const HeadInputs& head, ChunkRange r) {
  const int n = r.n, K = head.K;
  const double* k = &head.k[r.begin * K];
  const std::vector<double> a_r = chunk_a_r(head, r);
  // X[s] = -b_s sum_t A_r[t][s] k_t
  std::vector<double> x(static_cast<size_t>(n) * K, 0.0);
  for (int s = 0; s < n; ++s) {
    for (int t = s; t < n; ++t)
      for (int i = 0; i < K; ++i) x[s * K + i] += a_r[t * n + s] * k[t * K + i];
    for (int i = 0; i < K; ++i) x[s * K + i] *= -head.beta[r.begin + s];
  }
  return x;
}

ChunkStep chunk_step(const HeadInputs& head, ChunkRange r, const std::vector<double>& s) {
  const int n = r.n, K = head.K, V = head.V;
  const double* q = &head.q[r.begin * K];
  const double* k = &head.k[r.begin * K];
  const double* v = &head.v[r.begin * V];
  const double* beta = &head.beta[r.begin];
  const std::vector<double> g_cum = chunk_gate_cumsum(head, r);
  const double gamma = g_cum[n - 1];
  auto G = [&](int row, int col) { return std::exp(g_cum[row] - g_cum[col]); };  // row >= col

  ChunkStep step;
  step.a_r = chunk_a_r(head, r);

  // W = V - Gam (K S)
  std::vector<double> w = rows_times_state(k, n, s, K, V);
  for (int t = 0; t < n; ++t) {
    const double decay = std::exp(g_cum[t]);
    for (int j = 0; j < V; ++j) w[t * V + j] = v[t * V + j] - decay * w[t * V + j];
  }

  // Vd = (G ⊙ A_r ⊙ 1 b^T) W
  step.v_new.assign(static_cast<size_t>(n) * V, 0.0);
  for (int row = 0; row < n; ++row)
    for (int col = 0; col <= row; ++col) {
      const double coef = G(row, col) * step.a_r[row * n + col] * beta[col];
      for (int j = 0; j < V; ++j) step.v_new[row * V + j] += coef * w[col * V + j];
    }

  // O = scale (Gam (Q S) + (G ⊙ Q K^T) Vd)
  step.o = rows_times_state(q, n, s, K, V);
  for (int row = 0; row < n; ++row) {
    const double decay = std::exp(g_cum[row]);
    for (int j = 0; j < V; ++j) step.o[row * V + j] *= decay;
    for (int col = 0; col <= row; ++col) {
      const double coef = G(row, col) * dot(&q[row * K], &k[col * K], K);
      for (int j = 0; j < V; ++j) step.o[row * V + j] += coef * step.v_new[col * V + j];
    }
    for (int j = 0; j < V; ++j) step.o[row * V + j] *= head.scale;
  }

  // S' = e^gamma S + K^T (rho ⊙ Vd)
  step.s_next = s;
  const double chunk_decay = std::exp(gamma);
  for (double& x : step.s_next) x *= chunk_decay;
  for (int t = 0; t < n; ++t) {
    const double rho = std::exp(gamma - g_cum[t]);
    for (int i = 0; i < K; ++i) {
      const double coef = rho * k[t * K + i];
      for (int j = 0; j < V; ++j) step.s_next[i * V + j] += coef * step.v_new[t * V + j];
    }
  }
  return step;
}

std::vector<double> chunk_vd_wy(const HeadInputs& head, ChunkRange r, const std::vector<double>& s) {
  const int n = r.n, K = head.K, V = head.V;
  const double* k = &head.k[r.begin * K];
  const double* v = &head.v[r.begin * V];
  const double* beta = &head.beta[r.begin];
  const std::vector<double> g_cum = chunk_gate_cumsum(head, r);
  const std::vector<double> a_r = chunk_a_r(head, r);
  // W~ = (Gam A_r diag(b)) K: [n][K]
  std::vector<double> w_tilde(static_cast<size_t>(n) * K, 0.0);
  for (int row = 0; row < n; ++row)
    for (int col = 0; col <= row; ++col) {
      const double coef = std::exp(g_cum[row]) * a_r[row * n + col] * beta[col];
      for (int i = 0; i < K; ++i) w_tilde[row * K + i] += coef * k[col * K + i];
    }
  // Vd = (G (.) A_r (.) 1 b^T) V - W~ S
  std::vector<double> vd = rows_times_state(w_tilde.data(), n, s, K, V);
  for (double& x : vd) x = -x;
  for (int row = 0; row < n; ++row)
    for (int col = 0; col <= row; ++col) {
      const double coef = std::exp(g_cum[row] - g_cum[col]) * a_r[row * n + col] * beta[col];
      for (int j = 0; j < V; ++j) vd[row * V + j] += coef * v[col * V + j];
    }
  return vd;
}

HeadOutputs chunked_forward(const HeadInputs& head) {
  HeadOutputs out;
  out.o.assign(static_cast<size_t>(head.T) * head.V, 0.0);
  out.s_final = head.s0;
  for (int64_t c = 0; c < num_chunks(head.T); ++c) {
    const ChunkRange r = chunk_range(head, c);
    ChunkStep step = chunk_step(head, r, out.s_final);
    std::copy(step.o.begin(), step.o.end(), out.o.begin() + r.begin * head.V);
    out.s_final = std::move(step.s_next);
  }
  return out;
}

}  // namespace flashgdn::reference
