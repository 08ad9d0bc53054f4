// Shared helpers of the CPU tests: seeded random inputs in every gate regime, error metrics.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace flashgdn::testing {

// Every test draws fresh inputs; the seed is printed so a failure can be replayed with
// FLASHGDN_TEST_SEED=<seed>.
inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("FLASHGDN_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
}

// A fresh seed, printed so a passing run can be replayed too.
inline uint64_t announced_seed() {
  const uint64_t seed = fresh_seed();
  std::printf("[   SEED   ] FLASHGDN_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double normal() { return normal_(engine_); }
  double uniform(double lo = 0.0, double hi = 1.0) {
    return lo + (hi - lo) * uniform_(engine_);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

// Gate regimes of DESIGN §4.
enum class GateRegime {
  kZero,     // g == 0: no decay at all (the exact-M path of CP)
  kWeak,     // benchmark recipe: logsigmoid(randn) / 16
  kStrong,   // real-model recipe: -exp(A_log) * softplus(a + dt_bias), A_log ~ log U(0, 16)
  kMixed,    // weak decay with 25% of the heads at g == 0
};
inline const char* regime_name(GateRegime r) {
  switch (r) {
    case GateRegime::kZero: return "zero";
    case GateRegime::kWeak: return "weak";
    case GateRegime::kStrong: return "strong";
    case GateRegime::kMixed: return "mixed";
  }
  return "?";
}
inline constexpr GateRegime kAllRegimes[] = {GateRegime::kZero, GateRegime::kWeak,
                                             GateRegime::kStrong, GateRegime::kMixed};

inline double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
inline double log_sigmoid(double x) { return -softplus(-x); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Per-head gate generator: draws the head's constants once, then one gate per token.
class GateSampler {
 public:
  GateSampler(GateRegime regime, Rng& rng) : regime_(regime), rng_(rng) {
    zero_head_ = regime == GateRegime::kZero ||
                 (regime == GateRegime::kMixed && rng.uniform() < 0.25);
    a_log_ = std::log(rng.uniform(1e-3, 16.0));
    dt_bias_ = rng.normal();
  }
  double next() {
    if (zero_head_) return 0.0;
    if (regime_ == GateRegime::kStrong) return -std::exp(a_log_) * softplus(rng_.normal() + dt_bias_);
    return log_sigmoid(rng_.normal()) / 16.0;
  }
  bool zero_head() const { return zero_head_; }

 private:
  GateRegime regime_;
  Rng& rng_;
  bool zero_head_ = false;
  double a_log_ = 0.0, dt_bias_ = 0.0;
};

// ||a - b|| / ||b|| (returns ||a|| when ||b|| == 0).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ||a - b|| / max(||b||, floor): a relative error that a b cancelling to far below its terms' size
// (floor) does not inflate (a rounding of the terms then reads as an error of b itself).
inline double rel_l2_floor(const std::vector<double>& a, const std::vector<double>& b, double floor) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

inline bool all_finite(const std::vector<double>& a) {
  for (double x : a)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace flashgdn::testing
