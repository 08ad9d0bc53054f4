// Random (sequence, v-head) inputs for the CPU precision studies (precision_study, forward_precision):
// unit-norm q and k rows, v ~ N(0, 1), beta = sigmoid(randn), and the tests' "model" gates
// g = -A softplus(a + dt_bias) with A ~ U(1e-3, 16) and dt_bias ~ N(0, 1) a head (tests/gpu/conftest.py).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/core.h"

namespace flashgdn::bench {

struct HeadOptions {
  bool correlated_keys = false;  // k_t = normalise(base + 0.5 noise), base one N(0, 1) direction a head
  bool gate_free = false;        // g = 0 (the gate draws are made all the same)
  bool round_to_bf16 = false;    // q, k (after the norm) and v as bf16 inputs reach the kernels
};

// x rounded to bf16 (8 significant bits, round to nearest even).
inline double round_to_bf16(double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);
  return std::ldexp(std::nearbyint(std::ldexp(x, 8 - e)), e - 8);
}

inline reference::HeadInputs model_head(std::mt19937_64& rng, int64_t T, const HeadOptions& options = {}) {
  constexpr int kD = 128;
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> a_range(1e-3, 16.0);
  const auto stored = [&](double x) { return options.round_to_bf16 ? round_to_bf16(x) : x; };
  reference::HeadInputs in;
  in.T = T;
  in.K = in.V = kD;
  in.scale = 1.0 / std::sqrt(double(kD));
  in.q.resize(T * kD);
  in.k.resize(T * kD);
  in.v.resize(T * kD);
  in.g.resize(T);
  in.beta.resize(T);
  std::vector<double> base(kD);
  if (options.correlated_keys)
    for (double& b : base) b = normal(rng);
  for (auto* rows : {&in.q, &in.k}) {
    const bool shared_direction = options.correlated_keys && rows == &in.k;
    for (int64_t t = 0; t < T; ++t) {
      double norm2 = 0.0;
      for (int i = 0; i < kD; ++i) {
        double& e = (*rows)[t * kD + i];
        e = shared_direction ? base[i] + 0.5 * normal(rng) : normal(rng);
        norm2 += e * e;
      }
      for (int i = 0; i < kD; ++i) (*rows)[t * kD + i] = stored((*rows)[t * kD + i] / std::sqrt(norm2));
    }
  }
  for (double& x : in.v) x = stored(normal(rng));
  const double A = a_range(rng), dt_bias = normal(rng);
  for (int64_t t = 0; t < T; ++t) {
    const double a = normal(rng) + dt_bias;
    in.g[t] = options.gate_free ? 0.0 : -A * (a > 20.0 ? a : std::log1p(std::exp(a)));
    in.beta[t] = 1.0 / (1.0 + std::exp(-normal(rng)));
  }
  return in;
}

}  // namespace flashgdn::bench
