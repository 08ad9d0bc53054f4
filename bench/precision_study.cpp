// Where the SM90 backward's dg error comes from: the float64 chunked backward (reference) against
// itself with the kernels' bf16 roundings emulated (reference::bwd::KernelRounding), on the tests'
// "model" gates (g = -A softplus(a + dt_bias), A ~ U(1e-3, 16) per head), normalised random q, k,
// random v, beta = sigmoid(randn), d_o and dht ~ N(0, 1), no initial state. Per seed, the relative
// L2 error of dg over the heads, and the largest error's token, for each emulation (the worst-case
// summary also gives the error over the last chunk's tokens alone):
//   dot          S rounded in <dS, S> only
//   dot+last     the same, the sequence's last chunk's dot exact
//   states       S and dS rounded as GEMM operands and in the dot
//   all          states + every bf16 tile of the gradient pass
//   all+lastdot  all, the last chunk's dot exact (S in fp32 there: branch bwd-final-dot)
//   all+lastVd   all, Vd exact in the sequence's last chunk (a hi + lo split there)
//   all+last     all+lastVd with the last chunk's dot exact too
//   all-<tile>   all but one tile (the tile's share: "all" minus this)
//   pre          all+lastdot with the pre-pass's states as v4 computes them (prepass_states)
//   pre+hilo     pre with the state update's rho Vd exact (a hi + lo split: prepass_exact_update)
//   ds3, ds1     the dS pass's recurrence with its bf16 operands (KernelRounding::ds_pass): three
//                dependent rounds a chunk as today, or one round with the chunk's map folded first
//   pre+ds3, pre+ds1   pre with either
//   pre+a32      pre+ds3 with dg's a term from the fp32 products, as the gradient pass takes it
//                (KernelRounding::fp32_a): the emulation nearest today's kernels
//   pre+dot16    pre+a32 with dS rounded in <dS, S> too (the gradient pass forming the dot from its
//                bf16 tiles, the sequence's last chunk's still exact from the pre-pass)
//   pre+inv3, pre+inv16   pre+a32 with the chunk inverse as the kernels form it: its merges in split
//                bf16 (bf16x3, the backward's fp32 inverse today) or in fp16 (fp16x1, the forward's bf16
//                inverse since candidate-s41), bench/chunk_inverse_emulation.h
//   inv16+ar16, inv16+arbf16   pre+inv16 with A_r stored by the chunk inverse in fp16 or bf16 where
//                the gradient pass reads it unrounded (dbeta's first term, E's Ag (.) dAg; today fp32)
// The summary also gives the worst relative L2 errors of dq, dk, dv, dbeta and dh0 (the gradient of
// the initial state) for each emulation.
//
// Inputs: the "model" regime, or with [regime] correlated keys (k_t = normalise(base + 0.5 noise), one
// base a head: the chunk inverse's hardest), g = 0 (g0), or both (correlated-g0); [runs]: a comma-separated
// list of the emulations to run (default all).
//   build/bench/precision_study [T] [seeds] [heads] [regime] [runs]   (defaults 4133 4 4 model; ~3 s a head-run)
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "chunk_inverse_emulation.h"
#include "model_heads.h"
#include "reference/backward.h"

using flashgdn::reference::HeadInputs;
namespace bwd = flashgdn::reference::bwd;

namespace {

std::vector<double> inverse_bf16x3(const std::vector<double>& lower) {
  return flashgdn::bench::emulated_inverse(lower, flashgdn::bench::kInverseBf16x3);
}
std::vector<double> inverse_fp16x1(const std::vector<double>& lower) {
  return flashgdn::bench::emulated_inverse(lower, flashgdn::bench::kInverseFp16x1);
}

struct Emulation {
  std::string name;
  bwd::KernelRounding rounding;
};

std::vector<Emulation> emulations() {
  std::vector<Emulation> out = {{"dot", {.dot_state = true}},
                                {"dot+last", {.dot_state = true, .exact_last_dot = true}},
                                {"states", {.operand_states = true}},
                                {"all", {.operand_states = true, .tiles = true}},
                                {"all+lastdot", {.exact_last_dot = true, .operand_states = true, .tiles = true}},
                                {"all+lastVd", {.operand_states = true, .tiles = true, .exact_last_vd = true}},
                                {"all+last", {.exact_last_dot = true, .operand_states = true, .tiles = true, .exact_last_vd = true}}};
  // The pre-pass emulations, each a switch or two on top of another.
  const auto with = [](bwd::KernelRounding r, auto change) {
    change(r);
    return r;
  };
  const bwd::KernelRounding pre{.exact_last_dot = true, .operand_states = true, .tiles = true, .prepass_states = true};
  const bwd::KernelRounding hilo = with(pre, [](auto& r) { r.prepass_exact_update = true; });
  const bwd::KernelRounding a32 = with(hilo, [](auto& r) {
    r.fp32_a = true;
    r.ds_pass = bwd::DsPass::kThreeRounds;
  });
  out.push_back({"pre", pre});
  out.push_back({"pre+hilo", hilo});
  out.push_back({"ds3", {.ds_pass = bwd::DsPass::kThreeRounds}});
  out.push_back({"ds1", {.ds_pass = bwd::DsPass::kOneRound}});
  out.push_back({"pre+ds3", with(hilo, [](auto& r) { r.ds_pass = bwd::DsPass::kThreeRounds; })});
  out.push_back({"pre+ds1", with(hilo, [](auto& r) { r.ds_pass = bwd::DsPass::kOneRound; })});
  out.push_back({"pre+a32", a32});
  out.push_back({"pre+dot16", with(a32, [](auto& r) { r.dot_grad_state = true; })});
  out.push_back({"pre+inv3", with(a32, [](auto& r) { r.inverse = &inverse_bf16x3; })});
  const bwd::KernelRounding inv16 = with(a32, [](auto& r) { r.inverse = &inverse_fp16x1; });
  out.push_back({"pre+inv16", inv16});
  out.push_back({"inv16+ar16", with(inv16, [](auto& r) { r.inverse_store = bwd::InverseStore::kFp16; })});
  out.push_back({"inv16+arbf16", with(inv16, [](auto& r) { r.inverse_store = bwd::InverseStore::kBf16; })});
  for (unsigned i = 0; i < std::size(bwd::kTileNames); ++i)
    out.push_back({std::string("all-") + bwd::kTileNames[i],
                   {.operand_states = true, .tiles = true, .tile_mask = ~(1u << i)}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 4133;
  const int seeds = argc > 2 ? std::atoi(argv[2]) : 4, heads = argc > 3 ? std::atoi(argv[3]) : 4;
  const std::string regime = argc > 4 ? argv[4] : "model";
  if (regime != "model" && regime != "correlated" && regime != "g0" && regime != "correlated-g0") {
    std::fprintf(stderr, "regime: model, correlated, g0 or correlated-g0 (got %s)\n", regime.c_str());
    return 2;
  }
  const flashgdn::bench::HeadOptions options{.correlated_keys = regime.starts_with("correlated"),
                                             .gate_free = regime.ends_with("g0")};
  std::vector<Emulation> runs = emulations();
  if (argc > 5) {
    const std::string wanted = std::string(",") + argv[5] + ",";
    std::erase_if(runs, [&](const Emulation& e) { return wanted.find("," + e.name + ",") == std::string::npos; });
    if (runs.empty()) {
      std::fprintf(stderr, "runs: none of %s is an emulation\n", argv[5]);
      return 2;
    }
  }
  std::printf("regime %s\n", regime.c_str());
  std::vector<double> worst(runs.size(), 0.0), worst_last(runs.size(), 0.0);
  // dq, dk, dv, dbeta, dh0: per run the worst relative L2 error over the seeds (errors and norms summed over heads)
  constexpr int kOther = 5;
  constexpr const char* kOtherNames[kOther] = {"dq", "dk", "dv", "dbeta", "dh0"};
  std::vector<std::array<double, kOther>> worst_other(runs.size(), std::array<double, kOther>{});
  const int64_t last_chunk_start = (T - 1) / 64 * 64;
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::normal_distribution<double> normal;
    std::vector<double> squared(runs.size(), 0.0), largest(runs.size(), 0.0), squared_last(runs.size(), 0.0);
    std::vector<int64_t> at(runs.size(), 0);
    double norm2 = 0.0, norm2_last = 0.0;
    std::array<double, kOther> other_norm2{};
    std::vector<std::array<double, kOther>> other_squared(runs.size(), std::array<double, kOther>{});
    auto add_squares = [](const std::vector<double>& got, const std::vector<double>& want, double& err, double& norm) {
      for (size_t i = 0; i < want.size(); ++i) {
        err += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
      }
    };
    for (int h = 0; h < heads; ++h) {
      const HeadInputs in = flashgdn::bench::model_head(rng, T, options);
      std::vector<double> d_o(T * 128), dht(128 * 128);
      for (double& x : d_o) x = normal(rng);
      for (double& x : dht) x = normal(rng);
      const bwd::HeadGrads exact = bwd::backward_chunked(in, d_o, dht);
      for (int64_t t = 0; t < T; ++t) {
        norm2 += exact.dg[t] * exact.dg[t];
        if (t >= last_chunk_start) norm2_last += exact.dg[t] * exact.dg[t];
      }
      for (size_t r = 0; r < runs.size(); ++r) {
        const bwd::HeadGrads got = bwd::backward_chunked(in, d_o, dht, runs[r].rounding);
        std::array<double, kOther> unused{};
        std::array<double, kOther>& norms = r == 0 ? other_norm2 : unused;  // the exact norms, once
        add_squares(got.dq, exact.dq, other_squared[r][0], norms[0]);
        add_squares(got.dk, exact.dk, other_squared[r][1], norms[1]);
        add_squares(got.dv, exact.dv, other_squared[r][2], norms[2]);
        add_squares(got.dbeta, exact.dbeta, other_squared[r][3], norms[3]);
        add_squares(got.ds0, exact.ds0, other_squared[r][4], norms[4]);
        for (int64_t t = 0; t < T; ++t) {
          const double e = std::fabs(got.dg[t] - exact.dg[t]);
          squared[r] += e * e;
          if (t >= last_chunk_start) squared_last[r] += e * e;
          if (e > largest[r]) largest[r] = e, at[r] = t;
        }
      }
    }
    std::printf("seed %d:", seed);
    for (size_t r = 0; r < runs.size(); ++r) {
      const double rel = std::sqrt(squared[r] / norm2);
      worst[r] = std::max(worst[r], rel);
      worst_last[r] = std::max(worst_last[r], std::sqrt(squared_last[r] / norm2_last));
      for (int i = 0; i < kOther; ++i)
        worst_other[r][i] = std::max(worst_other[r][i], std::sqrt(other_squared[r][i] / other_norm2[i]));
      std::printf(" %s %.2e (t %lld)", runs[r].name.c_str(), rel, static_cast<long long>(at[r]));
    }
    std::printf("\n");
  }
  std::printf("worst dg rel L2 over %d seeds, T %lld, %d heads:", seeds, static_cast<long long>(T), heads);
  for (size_t r = 0; r < runs.size(); ++r) std::printf(" %s %.2e", runs[r].name.c_str(), worst[r]);
  std::printf("\nworst over the last chunk's tokens:");
  for (size_t r = 0; r < runs.size(); ++r) std::printf(" %s %.2e", runs[r].name.c_str(), worst_last[r]);
  for (int i = 0; i < kOther; ++i) {
    std::printf("\nworst %s rel L2:", kOtherNames[i]);
    for (size_t r = 0; r < runs.size(); ++r) std::printf(" %s %.2e", runs[r].name.c_str(), worst_other[r][i]);
  }
  std::printf("\n");
}
