// The token recurrence of DESIGN §1, the oracle of every test:
//     S_t = e^{g_t} (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = scale * S_t^T q_t
// evaluated as S <- e^{g_t} S; u = b_t (v_t - S^T k_t); S <- S + k_t u^T (the same expression,
// with the decayed state shared by both terms).
#include <cmath>

#include "reference/forward_math.h"

namespace flashgdn::reference {

HeadOutputs recurrent_forward(const HeadInputs& head) {
  const int K = head.K, V = head.V;
  HeadOutputs out;
  out.o.assign(static_cast<size_t>(head.T) * V, 0.0);
  out.s_final = head.s0;
  std::vector<double>& S = out.s_final;
  std::vector<double> u(V);
  for (int64_t t = 0; t < head.T; ++t) {
    const double* k = &head.k[t * K];
    const double* q = &head.q[t * K];
    const double* v = &head.v[t * V];
    const double decay = std::exp(head.g[t]);
    for (double& x : S) x *= decay;
    for (int j = 0; j < V; ++j) {
      double k_dot_s = 0.0;
      for (int i = 0; i < K; ++i) k_dot_s += k[i] * S[i * V + j];
      u[j] = head.beta[t] * (v[j] - k_dot_s);
    }
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < V; ++j) S[i * V + j] += k[i] * u[j];
    double* o = &out.o[t * V];
    for (int j = 0; j < V; ++j) {
      double q_dot_s = 0.0;
      for (int i = 0; i < K; ++i) q_dot_s += q[i] * S[i * V + j];
      o[j] = head.scale * q_dot_s;
    }
  }
  return out;
}

HeadInputs slice_tokens(const HeadInputs& head, int64_t begin, int64_t end,
                        std::vector<double> s0) {
  HeadInputs part;
  part.T = end - begin;
  part.K = head.K;
  part.V = head.V;
  part.q.assign(head.q.begin() + begin * head.K, head.q.begin() + end * head.K);
  part.k.assign(head.k.begin() + begin * head.K, head.k.begin() + end * head.K);
  part.v.assign(head.v.begin() + begin * head.V, head.v.begin() + end * head.V);
  part.g.assign(head.g.begin() + begin, head.g.begin() + end);
  part.beta.assign(head.beta.begin() + begin, head.beta.begin() + end);
  part.s0 = std::move(s0);
  part.scale = head.scale;
  return part;
}

}  // namespace flashgdn::reference
