// Where the fused forward's error comes from (v5, fused_forward_inv.cuh): its o against the float64
// chunked forward, with the kernel's bf16 operand roundings emulated (S^T's A fragments, W, Ag, Vd and
// rho Vd, P) and fp32 everywhere else. Two tables per input regime:
// (1) the chunk inverse (warpgroup_inverse.cuh) X = (I + L)^{-1}, L = diag(beta) StrictLower(K K^T),
// formed four ways (every other rounding on):
//   exact    X in float64: the floor, what the other roundings cost
//   bf16x3   today's kernel: the 16 x 16 diagonal blocks by fp32 substitution, the 16->32 and 32->64
//            merges as split bf16 products (hi.hi + hi.lo + lo.hi, fp32 accumulation), L, X and the
//            intermediate T held as hi + lo
//   bf16x1   the merges as single bf16 products: a third of the mma.sync, no lo tiles
//   fp16x1   the same in fp16 (FlashInfer's choice; its range ends at 65504)
// then Ag = G (.) X (.) 1 beta^T rounded to bf16, as the kernel stores it: the relative L2 error of
// Ag (over every chunk, against G (.) A_r (.) 1 beta^T in float64) and of o, and the largest |X|;
// (2) with the exact inverse, o's error with one of the bf16 operands kept exact at a time (its share
// of the error) and with none rounded. Errors are relative L2 over the heads' tokens. Inputs:
// model_heads.h's heads with q, k, v rounded to bf16 (for both sides), in four regimes: model gates or
// g = 0 (G = 1: X's off-diagonal blocks count whole), random keys or correlated ones sharing a
// direction (L's entries near beta, X's larger).
//   build/bench/forward_precision [T] [heads] [seeds]      (defaults 4096 4 2)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "chunk_inverse_emulation.h"
#include "model_heads.h"
#include "reference/forward_math.h"

using flashgdn::reference::HeadInputs;
namespace ref = flashgdn::reference;

namespace {

constexpr int kC = 64, kD = 128;

double bf16(double x) { return flashgdn::bench::round_to_bf16(x); }
double fp32(double x) { return flashgdn::bench::round_fp32(x); }

using Format = flashgdn::bench::InverseFormat;
using flashgdn::bench::emulated_inverse;
constexpr Format kFormats[] = {flashgdn::bench::kInverseExact, flashgdn::bench::kInverseBf16x3,
                               flashgdn::bench::kInverseBf16x1, flashgdn::bench::kInverseFp16x1};

using Matrix = std::vector<double>;  // [kC][kC], row-major

// Which of the kernel's bf16 operands are rounded (the inverse's own formats aside).
struct Roundings {
  const char* name;
  bool s = true, w = true, ag = true, vd = true, p = true;
};
constexpr Roundings kAllRounded{"all"};
constexpr Roundings kRoundings[] = {{"all"},
                                    {"S exact", false, true, true, true, true},
                                    {"W exact", true, false, true, true, true},
                                    {"Ag exact", true, true, false, true, true},
                                    {"Vd exact", true, true, true, false, true},
                                    {"P exact", true, true, true, true, false},
                                    {"none", false, false, false, false, false}};
double maybe_bf16(double x, bool round) { return round ? bf16(x) : x; }

struct Errors {
  double ag_err2 = 0.0, ag_norm2 = 0.0, o_err2 = 0.0, o_norm2 = 0.0;
  double max_x = 0.0;  // the largest |X| entry (fp16's range ends at 65504)
};

// The v5 forward of one head (T a multiple of kC) with the chunk inverse in format f; accumulates
// Ag's and o's squared errors against float64.
void emulated_forward(const HeadInputs& in, const Format& f, const Roundings& rnd, const std::vector<double>& o_exact,
                      Errors& err) {
  const int64_t T = in.T;
  std::vector<double> s(kD * kD, 0.0), sb(kD * kD), w(kC * kD), vd(kC * kD), u(kC * kD);
  for (int64_t c = 0; c < T / kC; ++c) {
    const ref::ChunkRange r = ref::chunk_range(in, c);
    const std::vector<double> g = ref::chunk_gate_cumsum(in, r);
    const double* k = &in.k[r.begin * kD];
    const double* q = &in.q[r.begin * kD];
    const double* v = &in.v[r.begin * kD];
    const double* beta = &in.beta[r.begin];
    // L = diag(beta) StrictLower(K K^T) in fp32; X; Ag
    Matrix l(kC * kC, 0.0);
    for (int i = 0; i < kC; ++i)
      for (int j = 0; j < i; ++j) {
        double dot = 0.0;
        for (int d = 0; d < kD; ++d) dot += k[i * kD + d] * k[j * kD + d];
        l[i * kC + j] = fp32(beta[i] * fp32(dot));
      }
    const Matrix a_r = ref::chunk_a_r(in, r);
    const Matrix x = f.exact ? a_r : emulated_inverse(l, f);
    for (double e : x) err.max_x = std::fmax(err.max_x, std::fabs(e));
    Matrix ag(kC * kC, 0.0);
    for (int i = 0; i < kC; ++i)
      for (int j = 0; j <= i; ++j) {
        const double gate = std::exp(g[i] - g[j]);
        ag[i * kC + j] = maybe_bf16(fp32(gate * x[i * kC + j] * beta[j]), rnd.ag);
        const double want = gate * a_r[i * kC + j] * beta[j];
        err.ag_err2 += (ag[i * kC + j] - want) * (ag[i * kC + j] - want);
        err.ag_norm2 += want * want;
      }
    for (int i = 0; i < kD * kD; ++i) sb[i] = maybe_bf16(s[i], rnd.s);
    // U = K S_b; W = bf16(V - Gamma U); Vd = Ag W
    for (int t = 0; t < kC; ++t)
      for (int j = 0; j < kD; ++j) {
        double sum = 0.0;
        for (int d = 0; d < kD; ++d) sum += k[t * kD + d] * sb[d * kD + j];
        u[t * kD + j] = fp32(sum);
        w[t * kD + j] = maybe_bf16(fp32(v[t * kD + j] - std::exp(g[t]) * u[t * kD + j]), rnd.w);
      }
    for (int t = 0; t < kC; ++t)
      for (int j = 0; j < kD; ++j) {
        double sum = 0.0;
        for (int s2 = 0; s2 <= t; ++s2) sum += ag[t * kC + s2] * w[s2 * kD + j];
        vd[t * kD + j] = fp32(sum);
      }
    // O = scale (Gamma (Q S_b) + P bf16(Vd)),  P = bf16(G (.) Q K^T)
    for (int t = 0; t < kC; ++t) {
      std::vector<double> p(t + 1);
      for (int s2 = 0; s2 <= t; ++s2) {
        double dot = 0.0;
        for (int d = 0; d < kD; ++d) dot += q[t * kD + d] * k[s2 * kD + d];
        p[s2] = maybe_bf16(fp32(std::exp(g[t] - g[s2]) * dot), rnd.p);
      }
      for (int j = 0; j < kD; ++j) {
        double qs = 0.0, pv = 0.0;
        for (int d = 0; d < kD; ++d) qs += q[t * kD + d] * sb[d * kD + j];
        for (int s2 = 0; s2 <= t; ++s2) pv += p[s2] * maybe_bf16(vd[s2 * kD + j], rnd.vd);
        const double o = in.scale * (std::exp(g[t]) * fp32(qs) + fp32(pv));
        const double want = o_exact[(r.begin + t) * kD + j];
        err.o_err2 += (o - want) * (o - want);
        err.o_norm2 += want * want;
      }
    }
    // S' = e^gamma S + K^T bf16(rho (.) Vd), in fp32
    const double gamma = g[kC - 1];
    for (int d = 0; d < kD; ++d)
      for (int j = 0; j < kD; ++j) {
        double sum = 0.0;
        for (int t = 0; t < kC; ++t)
          sum += k[t * kD + d] * maybe_bf16(fp32(std::exp(gamma - g[t]) * vd[t * kD + j]), rnd.vd);
        s[d * kD + j] = fp32(std::exp(gamma) * s[d * kD + j] + fp32(sum));
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = (argc > 1 ? std::atoll(argv[1]) : 4096) / kC * kC;
  const int heads = argc > 2 ? std::atoi(argv[2]) : 4, seeds = argc > 3 ? std::atoi(argv[3]) : 2;
  constexpr size_t kFormatCount = std::size(kFormats), kRoundingCount = std::size(kRoundings);
  for (int regime = 0; regime < 4; ++regime) {
    const bool correlated = regime % 2 == 1, gate_free = regime >= 2;
    std::printf("%s keys, %s, T %lld, %d heads x %d seeds (worst seed; rel L2 over the seed's heads)\n",
                correlated ? "correlated" : "random", gate_free ? "g = 0" : "model gates", static_cast<long long>(T),
                heads, seeds);
    double worst_ag[kFormatCount] = {}, worst_o[kFormatCount] = {}, worst_share[kRoundingCount] = {}, max_x = 0.0;
    for (int seed = 0; seed < seeds; ++seed) {
      std::mt19937_64 rng(static_cast<uint64_t>(seed) + 1000 * regime);
      Errors err[kFormatCount], share[kRoundingCount];
      for (int h = 0; h < heads; ++h) {
        HeadInputs in = flashgdn::bench::model_head(
            rng, T, {.correlated_keys = correlated, .gate_free = gate_free, .round_to_bf16 = true});
        in.s0.assign(kD * kD, 0.0);
        const std::vector<double> o_exact = ref::chunked_forward(in).o;
        for (size_t f = 0; f < kFormatCount; ++f) emulated_forward(in, kFormats[f], kAllRounded, o_exact, err[f]);
        for (size_t r = 1; r < kRoundingCount; ++r) emulated_forward(in, kFormats[0], kRoundings[r], o_exact, share[r]);
      }
      share[0] = err[0];  // "all" with the exact inverse
      for (size_t f = 0; f < kFormatCount; ++f) {
        worst_ag[f] = std::fmax(worst_ag[f], std::sqrt(err[f].ag_err2 / err[f].ag_norm2));
        worst_o[f] = std::fmax(worst_o[f], std::sqrt(err[f].o_err2 / err[f].o_norm2));
        max_x = std::fmax(max_x, err[f].max_x);
      }
      for (size_t r = 0; r < kRoundingCount; ++r)
        worst_share[r] = std::fmax(worst_share[r], std::sqrt(share[r].o_err2 / share[r].o_norm2));
    }
    for (size_t f = 0; f < kFormatCount; ++f)
      std::printf("  inverse %-7s Ag %.3e   o %.3e\n", kFormats[f].name, worst_ag[f], worst_o[f]);
    std::printf("  largest |X| entry %.3f\n  bf16 operands rounded, exact inverse:", max_x);
    for (size_t r = 0; r < kRoundingCount; ++r) std::printf(" %s %.3e;", kRoundings[r].name, worst_share[r]);
    std::printf("\n");
  }
}
