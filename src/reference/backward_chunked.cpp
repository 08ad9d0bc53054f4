// Float64 reference backward in the CHUNKED form — the equations the SM90 backward kernel follows.
// Checked against the token-level oracle (backward_tokens.cpp) to ~1e-12 in every gate regime.
//
// Notation, per chunk of C = 64 rows (a partial last chunk has n < C valid rows; everything below
// then runs on those n rows, which is what zero-padded rows with a zero gate compute on the GPU):
// Q, K [C,K]; V, dO [C,V]; β, g [C]; S = state entering the chunk [K,V]; dS = ∂L/∂S' for the state
// S' leaving it [K,V] (dS_T, or 0, for the last chunk); s = scale.
//
// ── Pre-pass (forward, chunk by chunk): the entering state of every chunk, S_{c+1} = S'(S_c).
//
// ── Recompute, per chunk (chunks visited last to first):
//   g_s  = inclusive cumsum of g inside the chunk        [C]
//   γ    = g_s[n−1]   (last VALID row of a partial chunk)
//   e    = exp(g_s),  Γ = diag(e)                        [C]
//   ρ    = exp(γ − g_s)                                  [C]
//   G    = exp(g_s[i] − g_s[j]) for i ≥ j, else 0        [C,C]  (diagonal 1)
//   KK   = K Kᵀ                                          [C,C]
//   A_r  = (I + StrictLower(diag(β) KK))⁻¹               [C,C]  unit lower, gate-free
//   Ag   = G ⊙ A_r ⊙ 1βᵀ                                 [C,C]  (Ag[i,j] = G A_r[i,j] β_j)
//   U    = K S                                           [C,V]
//   W    = V − Γ U                                       [C,V]
//   Vd   = Ag W                                          [C,V]  (= β ⊙ r, the "v_new")
//   P    = Q Kᵀ;   Pg = s·(G ⊙ P)                        [C,C]  lower incl. diagonal
// forward of the chunk, for reference:
//   O    = s Γ Q S + Pg Vd                               [C,V]
//   S'   = e^γ S + Kᵀ (ρ ⊙ Vd)                           [K,V]
//
// ── Gradients of one chunk:
//   dVd  = diag(ρ) K dS + Pgᵀ dO                         [C,V]
//   dPg  = dO Vdᵀ                (used on i ≥ j)         [C,C]
//   dW   = Agᵀ dVd               → dv = dW               [C,V]
//   dAg  = dVd Wᵀ                (used on i ≥ j)         [C,C]
//   dU   = −Γ dW                                         [C,V]
//   dP   = s·(G ⊙ dPg)                                   [C,C]
//   dQ_a = s Γ dO Sᵀ                                     [C,K]
//   dK_a = diag(ρ) Vd dSᵀ                                [C,K]
//   dA_r = dAg ⊙ G ⊙ 1βᵀ                                 [C,C]
//   dL   = −StrictLower(A_rᵀ dA_r A_rᵀ)                  [C,C]  (d(M⁻¹) = −M⁻¹ dM M⁻¹)
//   dM   = diag(β) dL                                    [C,C]  (gradient of KK, strictly lower)
//   dq   = dQ_a + dP K                                   [C,K]
//   dk   = dK_a + dU Sᵀ + dPᵀ Q + (dM + dMᵀ) K           [C,K]
//   dβ_j = Σ_i (dAg ⊙ G ⊙ A_r)[i,j]  +  Σ_i (dL ⊙ KK)[j,i]                   [C]
//   dS_prev = e^γ dS + Kᵀ dU + s Qᵀ Γ dO                 [K,V]  → dS of the previous chunk
// Gate gradient, first w.r.t. the chunk-local cumsum g_s:
//   E    = Pg ⊙ dPg + Ag ⊙ dAg   (= dG ⊙ G)              [C,C]
//   dg_s[i] = Σ_j E[i,j] − Σ_j E[j,i]                    (G[i,j] = e^{g_s[i] − g_s[j]})
//           + Σ_k (Q ⊙ dQ_a)[i,k]                        (Γ in s Γ Q S)
//           + Σ_v (dU ⊙ U)[i,v]                          (Γ in W = V − Γ U)
//           − Σ_k (K ⊙ dK_a)[i,k]                        (ρ = e^{γ − g_s})
//   dγ   = e^γ ⟨dS, S⟩ + Σ_{i,k} (K ⊙ dK_a)[i,k]         (e^γ S and ρ)
//   dg_s[n−1] += dγ
// then w.r.t. the raw gate (g_s[i] = Σ_{j ≤ i} g_j): a reverse cumsum inside the chunk,
//   dg[j] = Σ_{i = j}^{n−1} dg_s[i].
// dS_0 (d_initial_state) is dS_prev of the first chunk.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/host_dtype.h"
#include "reference/backward.h"

namespace flashgdn::reference::bwd {
namespace {

using Mat = std::vector<double>;  // row-major

// C[m,n] = A[m,k] B[k,n]
Mat mm(const Mat& A, const Mat& B, int m, int k, int n) {
  Mat C(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) {
      const double a = A[i * k + p];
      if (a == 0.0) continue;
      for (int j = 0; j < n; ++j) C[i * n + j] += a * B[p * n + j];
    }
  return C;
}
// C[m,n] = A[k,m]ᵀ B[k,n]
Mat mm_tn(const Mat& A, const Mat& B, int k, int m, int n) {
  Mat C(static_cast<size_t>(m) * n, 0.0);
  for (int p = 0; p < k; ++p)
    for (int i = 0; i < m; ++i) {
      const double a = A[p * m + i];
      if (a == 0.0) continue;
      for (int j = 0; j < n; ++j) C[i * n + j] += a * B[p * n + j];
    }
  return C;
}
// C[m,n] = A[m,k] B[n,k]ᵀ
Mat mm_nt(const Mat& A, const Mat& B, int m, int k, int n) {
  Mat C(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) acc += A[i * k + p] * B[j * k + p];
      C[i * n + j] = acc;
    }
  return C;
}

// The recomputed quantities of one chunk.
struct ChunkFwd {
  int n = 0;
  Mat Q, K, Vm, dO;     // [n,K], [n,K], [n,V], [n,V]
  std::vector<double> beta, gs, e, rho;  // [n]
  double gamma = 0.0;
  Mat G, KK, Ar, Ag, P, Pg;  // [n,n]
  Mat U, W, Vd;              // [n,V]
};

ChunkFwd recompute(const HeadInputs& h, const std::vector<double>* d_o, int64_t t0, int n,
                   const Mat& S, std::vector<double> (*inverse)(const std::vector<double>&) = nullptr) {
  const int Kd = h.K, Vd = h.V;
  ChunkFwd c;
  c.n = n;
  c.Q.assign(h.q.begin() + t0 * Kd, h.q.begin() + (t0 + n) * Kd);
  c.K.assign(h.k.begin() + t0 * Kd, h.k.begin() + (t0 + n) * Kd);
  c.Vm.assign(h.v.begin() + t0 * Vd, h.v.begin() + (t0 + n) * Vd);
  if (d_o) c.dO.assign(d_o->begin() + t0 * Vd, d_o->begin() + (t0 + n) * Vd);
  c.beta.assign(h.beta.begin() + t0, h.beta.begin() + t0 + n);
  c.gs.resize(n);
  double acc = 0.0;
  for (int i = 0; i < n; ++i) c.gs[i] = (acc += h.g[t0 + i]);
  c.gamma = c.gs[n - 1];
  c.e.resize(n);
  c.rho.resize(n);
  for (int i = 0; i < n; ++i) {
    c.e[i] = std::exp(c.gs[i]);
    c.rho[i] = std::exp(c.gamma - c.gs[i]);
  }
  c.G.assign(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) c.G[i * n + j] = std::exp(c.gs[i] - c.gs[j]);
  c.KK = mm_nt(c.K, c.K, n, Kd, n);
  // A_r = (I + StrictLower(diag(β) KK))⁻¹ by forward substitution, row by row:
  // A_r[i,:] = e_i − Σ_{j<i} β_i KK[i,j] A_r[j,:].
  c.Ar.assign(static_cast<size_t>(n) * n, 0.0);
  if (inverse) {  // the kernels' inverse from L in fp32, padded to a whole chunk
    Mat lower(static_cast<size_t>(kChunk) * kChunk, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j) lower[i * kChunk + j] = static_cast<float>(c.beta[i] * c.KK[i * n + j]);
    const Mat x = inverse(lower);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) c.Ar[i * n + j] = x[i * kChunk + j];
  } else {
    for (int i = 0; i < n; ++i) {
      c.Ar[i * n + i] = 1.0;
      for (int j = 0; j < i; ++j) {
        const double l = c.beta[i] * c.KK[i * n + j];
        for (int m = 0; m <= j; ++m) c.Ar[i * n + m] -= l * c.Ar[j * n + m];
      }
    }
  }
  c.Ag.assign(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) c.Ag[i * n + j] = c.G[i * n + j] * c.Ar[i * n + j] * c.beta[j];
  c.U = mm(c.K, S, n, Kd, Vd);
  c.W = c.Vm;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < Vd; ++j) c.W[i * Vd + j] -= c.e[i] * c.U[i * Vd + j];
  c.Vd = mm(c.Ag, c.W, n, n, Vd);
  c.P = mm_nt(c.Q, c.K, n, Kd, n);
  c.Pg.assign(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) c.Pg[i * n + j] = h.scale * c.G[i * n + j] * c.P[i * n + j];
  return c;
}

// S' = e^γ S + Kᵀ (ρ ⊙ Vd)
Mat next_state(const ChunkFwd& c, const Mat& S, int Kd, int Vd) {
  Mat rv = c.Vd;
  for (int i = 0; i < c.n; ++i)
    for (int j = 0; j < Vd; ++j) rv[i * Vd + j] *= c.rho[i];
  Mat Sn = mm_tn(c.K, rv, c.n, Kd, Vd);
  const double eg = std::exp(c.gamma);
  for (size_t i = 0; i < Sn.size(); ++i) Sn[i] += eg * S[i];
  return Sn;
}

double to_bf16(double x) { return static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)))); }
double to_fp16(double x) { return static_cast<double>(static_cast<_Float16>(static_cast<float>(x))); }
Mat bf16(Mat m) {
  for (double& x : m) x = to_bf16(x);
  return m;
}

// dS_prev from dS = D as the dS pass computes it (KernelRounding::ds_pass), every product's operands
// rounded to bf16, its accumulators exact (fp32 in the kernel), D itself kept unrounded between chunks.
Mat ds_pass_step(const ChunkFwd& c, const Mat& D, double s, DsPass mode, int Kd, int Vd) {
  const int n = c.n;
  Mat rhoK = c.K, agneg(static_cast<size_t>(n) * n, 0.0), sGQ = c.Q;  // rho K, -Ag Gamma, s Gamma Q
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < Kd; ++k) {
      rhoK[i * Kd + k] *= c.rho[i];
      sGQ[i * Kd + k] *= s * c.e[i];
    }
    for (int j = 0; j < n; ++j) agneg[i * n + j] = -c.Ag[i * n + j] * c.e[j];
  }
  rhoK = bf16(rhoK), agneg = bf16(agneg), sGQ = bf16(sGQ);
  const Mat Pg = bf16(c.Pg), Dr = bf16(D);
  Mat next = mm_tn(sGQ, c.dO, n, Kd, Vd);  // (s Gamma Q)^T dO [K,V]
  if (mode == DsPass::kThreeRounds) {
    Mat dVd = mm(rhoK, Dr, n, Kd, Vd);  // [n,V]
    const Mat PdO = mm_tn(Pg, c.dO, n, n, Vd);
    for (size_t i = 0; i < dVd.size(); ++i) dVd[i] += PdO[i];
    const Mat dU = bf16(mm_tn(agneg, bf16(dVd), n, n, Vd));  // (-Ag Gamma)^T dVd [n,V]
    const Mat a = mm_tn(c.K, dU, n, Kd, Vd);
    for (size_t i = 0; i < next.size(); ++i) next[i] += a[i];
  } else {
    const Mat Bt = bf16(mm_tn(agneg, rhoK, n, n, Kd));            // B^T = (-Ag Gamma)^T (rho K) [n,K]
    const Mat Ft = bf16(mm_tn(c.K, Bt, n, Kd, Kd));               // F^T = K^T B^T [K,K]
    const Mat Xt = bf16(mm_tn(Pg, c.dO, n, n, Vd));               // X^T = Pg^T dO [n,V]
    const Mat Ct = bf16(mm_tn(agneg, Xt, n, n, Vd));              // C^T = (-Ag Gamma)^T X^T [n,V]
    const Mat a = mm(Ft, Dr, Kd, Kd, Vd), b = mm_tn(c.K, Ct, n, Kd, Vd);
    for (size_t i = 0; i < next.size(); ++i) next[i] += a[i] + b[i];
  }
  const double eg = std::exp(c.gamma);
  for (size_t i = 0; i < next.size(); ++i) next[i] += eg * D[i];
  return next;
}

}  // namespace

HeadGrads backward_chunked(const HeadInputs& h, const std::vector<double>& d_o,
                           const std::vector<double>& d_sT, const KernelRounding& rounding) {
  const int Kd = h.K, Vd = h.V;
  const int64_t T = h.T;
  const size_t kv = static_cast<size_t>(Kd) * Vd;
  const double s = h.scale;
  HeadGrads gr;
  gr.dq.assign(static_cast<size_t>(T) * Kd, 0.0);
  gr.dk.assign(static_cast<size_t>(T) * Kd, 0.0);
  gr.dv.assign(static_cast<size_t>(T) * Vd, 0.0);
  gr.dg.assign(static_cast<size_t>(T), 0.0);
  gr.dbeta.assign(static_cast<size_t>(T), 0.0);

  auto round_in_place = [&](bool on, Mat& m) {
    if (on) m = bf16(std::move(m));
  };
  auto rounded = [&](bool on, const Mat& m, Mat& storage) -> const Mat& {  // m, or its rounding in storage
    if (!on) return m;
    storage = bf16(m);
    return storage;
  };
  auto tiled = [&](int i) { return rounding.tiles && (rounding.tile_mask >> i & 1u) != 0; };

  // Pre-pass: entering state of every chunk (with prepass_states, v4's operand roundings).
  const int64_t num_chunks = (T + kChunk - 1) / kChunk;
  std::vector<Mat> entering;
  entering.reserve(static_cast<size_t>(num_chunks));
  Mat S = h.s0.size() == kv ? h.s0 : Mat(kv, 0.0);
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t t0 = c * kChunk;
    const int n = static_cast<int>(std::min<int64_t>(kChunk, T - t0));
    entering.push_back(S);
    if (!rounding.prepass_states) {
      S = next_state(recompute(h, nullptr, t0, n, S, rounding.inverse), S, Kd, Vd);
      continue;
    }
    Mat S_r;
    const ChunkFwd cf = recompute(h, nullptr, t0, n, rounded(true, S, S_r), rounding.inverse);
    Mat rv = cf.Vd;  // [n,V] rho Vd, the update's operand
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < Vd; ++j) rv[i * Vd + j] *= cf.rho[i];
    round_in_place(!rounding.prepass_exact_update, rv);
    Mat Sn = mm_tn(cf.K, rv, n, Kd, Vd);
    const double eg = std::exp(cf.gamma);
    for (size_t i = 0; i < Sn.size(); ++i) Sn[i] += eg * S[i];
    S = std::move(Sn);
  }

  Mat dS = d_sT.size() == kv ? d_sT : Mat(kv, 0.0);
  for (int64_t ci = num_chunks - 1; ci >= 0; --ci) {
    const int64_t t0 = ci * kChunk;
    const int n = static_cast<int>(std::min<int64_t>(kChunk, T - t0));
    // The kernels' bf16 roundings (KernelRounding; none by default): S0 and dSo are S and dS as
    // GEMM operands, S_dot and dS_dot those of <dS, S>, *_t the gradient pass's tiles (kTileNames); a rounded
    // copy is made only where one is asked for.
    Mat S_r, dS_r, Ag_r, W_r, Pg_r, Ar_r, Vd_r;
    const Mat& S_exact = entering[static_cast<size_t>(ci)];
    const bool last = ci == num_chunks - 1;
    const bool dot_rounded = (rounding.operand_states || rounding.dot_state) && !(rounding.exact_last_dot && last);
    const Mat& S_bf16 = rounded(rounding.operand_states || dot_rounded, S_exact, S_r);
    const Mat& S0 = rounding.operand_states ? S_bf16 : S_exact;
    const Mat& S_dot = dot_rounded ? S_bf16 : S_exact;
    const Mat& dS_bf16 = rounded(rounding.operand_states || (rounding.dot_grad_state && dot_rounded), dS, dS_r);
    const Mat& dSo = rounding.operand_states ? dS_bf16 : dS;
    const Mat& dS_dot = rounding.dot_grad_state && dot_rounded ? dS_bf16 : dS;
    const ChunkFwd c = recompute(h, &d_o, t0, n, S0, rounding.inverse);
    const Mat& Ag_t = rounded(tiled(0), c.Ag, Ag_r);
    const Mat& W_t = rounded(tiled(1), c.W, W_r);
    const Mat& Pg_t = rounded(tiled(2), c.Pg, Pg_r);
    // A_r as the gradient pass reads it (KernelRounding::inverse_store), its tile rounded from that
    Mat Ar_stored;
    if (rounding.inverse_store != InverseStore::kFp32) {
      Ar_stored = c.Ar;
      for (double& x : Ar_stored) x = rounding.inverse_store == InverseStore::kFp16 ? to_fp16(x) : to_bf16(x);
    }
    const Mat& Ar_read = Ar_stored.empty() ? c.Ar : Ar_stored;
    const Mat& Ar_t = rounded(tiled(3), Ar_read, Ar_r);
    Mat Vd_acc;  // Vd as the fp32 accumulator holds it, before its tile's rounding
    if (rounding.tiles && !(rounding.exact_last_vd && last)) {  // Vd from the rounded Ag and W
      Vd_r = mm(Ag_t, W_t, n, n, Vd);
      if (rounding.fp32_a) Vd_acc = Vd_r;
      round_in_place(tiled(4), Vd_r);
    }
    const Mat& Vd_t = Vd_r.empty() ? c.Vd : Vd_r;

    // dVd = diag(ρ) K dS + Pgᵀ dO
    Mat KdS = mm(c.K, dSo, n, Kd, Vd);  // [n,V]
    Mat dVd = mm_tn(Pg_t, c.dO, n, n, Vd);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < Vd; ++j) dVd[i * Vd + j] += c.rho[i] * KdS[i * Vd + j];
    round_in_place(tiled(5), dVd);
    // dPg = dO Vdᵀ, dW = Agᵀ dVd, dAg = dVd Wᵀ, dU = −Γ dW
    Mat dPg = mm_nt(c.dO, Vd_t, n, Vd, n);
    Mat dW = mm_tn(Ag_t, dVd, n, n, Vd);
    Mat dAg = mm_nt(dVd, W_t, n, Vd, n);
    Mat dU = dW;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < Vd; ++j) dU[i * Vd + j] *= -c.e[i];
    // dP = s G ⊙ dPg (lower incl. diagonal)
    Mat dP(static_cast<size_t>(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) dP[i * n + j] = s * c.G[i * n + j] * dPg[i * n + j];
    // dQ_a = s Γ dO Sᵀ;  dK_a = diag(ρ) Vd dSᵀ
    Mat dQa = mm_nt(c.dO, S0, n, Vd, Kd);
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < Kd; ++k) dQa[i * Kd + k] *= s * c.e[i];
    Mat dKa = mm_nt(Vd_t, dSo, n, Vd, Kd);
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < Kd; ++k) dKa[i * Kd + k] *= c.rho[i];
    // dA_r = dAg ⊙ G ⊙ 1βᵀ;  dβ (first term) = column sums of dAg ⊙ G ⊙ A_r
    Mat dAr(static_cast<size_t>(n) * n, 0.0);
    std::vector<double> dbeta(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) {
        const double t = dAg[i * n + j] * c.G[i * n + j];
        dAr[i * n + j] = t * c.beta[j];
        dbeta[j] += t * Ar_read[i * n + j];
      }
    // dL = −StrictLower(A_rᵀ dA_r A_rᵀ)
    Mat dAr_r;
    Mat X = mm_tn(Ar_t, rounded(tiled(6), dAr, dAr_r), n, n, n);  // A_rᵀ dA_r
    round_in_place(tiled(7), X);
    Mat Y = mm_nt(X, Ar_t, n, n, n);                       // (A_rᵀ dA_r) A_rᵀ
    Mat dL(static_cast<size_t>(n) * n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j) dL[i * n + j] = -Y[i * n + j];
    // dβ (second term) = row sums of dL ⊙ KK;  dM = diag(β) dL
    Mat dMsym(static_cast<size_t>(n) * n, 0.0);  // dM + dMᵀ
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j) {
        dbeta[i] += dL[i * n + j] * c.KK[i * n + j];
        const double dm = tiled(10) ? to_bf16(c.beta[i] * dL[i * n + j]) : c.beta[i] * dL[i * n + j];
        dMsym[i * n + j] += dm;
        dMsym[j * n + i] += dm;
      }
    // dq = dQ_a + dP K
    Mat dP_r;
    const Mat& dP_t = rounded(tiled(8), dP, dP_r);
    Mat dq = mm(dP_t, c.K, n, n, Kd);
    for (size_t i = 0; i < dq.size(); ++i) dq[i] += dQa[i];
    // dk = dK_a + dU Sᵀ + dPᵀ Q + (dM + dMᵀ) K
    Mat dU_r;
    Mat dk = mm_nt(rounded(tiled(9), dU, dU_r), S0, n, Vd, Kd);
    {
      Mat a = mm_tn(dP_t, c.Q, n, n, Kd);
      Mat b = mm(dMsym, c.K, n, n, Kd);
      for (size_t i = 0; i < dk.size(); ++i) dk[i] += dKa[i] + a[i] + b[i];
    }
    // Gate gradient w.r.t. g_s.
    std::vector<double> dgs(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) {
        const double ag = Ar_stored.empty() ? c.Ag[i * n + j] : c.G[i * n + j] * Ar_read[i * n + j] * c.beta[j];
        const double E = c.Pg[i * n + j] * dPg[i * n + j] + ag * dAg[i * n + j];
        dgs[i] += E;
        dgs[j] -= E;
      }
    double dgamma = 0.0;
    for (int i = 0; i < n; ++i) {
      double qa = 0.0, ka = 0.0, uu = 0.0;
      for (int k = 0; k < Kd; ++k) qa += c.Q[i * Kd + k] * dQa[i * Kd + k];
      if (rounding.fp32_a && !Vd_acc.empty()) {  // rho_i sum_j (K dS)_ij Vd_ij
        for (int j = 0; j < Vd; ++j) ka += KdS[i * Vd + j] * Vd_acc[i * Vd + j];
        ka *= c.rho[i];
      } else {
        for (int k = 0; k < Kd; ++k) ka += c.K[i * Kd + k] * dKa[i * Kd + k];
      }
      for (int j = 0; j < Vd; ++j) uu += dU[i * Vd + j] * c.U[i * Vd + j];
      dgs[i] += qa + uu - ka;
      dgamma += ka;
    }
    const double eg = std::exp(c.gamma);
    {
      double dot = 0.0;
      for (size_t i = 0; i < kv; ++i) dot += dS_dot[i] * S_dot[i];
      dgamma += eg * dot;
    }
    dgs[n - 1] += dgamma;
    // dS_prev = e^γ dS + Kᵀ dU + s Qᵀ Γ dO
    if (rounding.ds_pass != DsPass::kExact) {
      dS = ds_pass_step(c, dS, s, rounding.ds_pass, Kd, Vd);
    } else {
      Mat GdO = c.dO;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < Vd; ++j) GdO[i * Vd + j] *= s * c.e[i];
      Mat a = mm_tn(c.K, dU, n, Kd, Vd);
      Mat b = mm_tn(c.Q, GdO, n, Kd, Vd);
      for (size_t i = 0; i < kv; ++i) dS[i] = eg * dS[i] + a[i] + b[i];
    }

    // Write out; the raw-gate gradient is the reverse cumsum of dg_s inside the chunk.
    std::copy(dq.begin(), dq.end(), gr.dq.begin() + t0 * Kd);
    std::copy(dk.begin(), dk.end(), gr.dk.begin() + t0 * Kd);
    std::copy(dW.begin(), dW.end(), gr.dv.begin() + t0 * Vd);
    std::copy(dbeta.begin(), dbeta.end(), gr.dbeta.begin() + t0);
    double run = 0.0;
    for (int i = n - 1; i >= 0; --i) gr.dg[t0 + i] = (run += dgs[i]);
  }
  gr.ds0 = std::move(dS);
  return gr;
}

}  // namespace flashgdn::reference::bwd
