// Fixtures of the reference forward tests: seeded random (sequence, v-head) inputs as DESIGN §4
// makes them (q, k L2-normalised randn, v randn, beta = sigmoid(randn), gates of a GateRegime),
// and small matrix helpers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "reference/forward_math.h"
#include "test_util.h"

namespace flashgdn::testing {

// Random chunk-aligned segment starts, each segment 1..max_chunks chunks long.
inline std::vector<int64_t> random_segments(Rng& rng, int64_t T, int64_t max_chunks) {
  std::vector<int64_t> begins;
  for (int64_t b = 0; b < T; b += rng.integer(1, max_chunks) * reference::kChunk) begins.push_back(b);
  return begins;
}

inline std::string segments_text(const std::vector<int64_t>& begins) {
  std::string text = "segments at";
  for (int64_t b : begins) (text += ' ') += std::to_string(b);
  return text;
}

inline std::vector<double> randn(Rng& rng, size_t n, double stddev = 1.0) {
  std::vector<double> x(n);
  for (double& e : x) e = stddev * rng.normal();
  return x;
}

struct RandomHead {
  reference::HeadInputs in;
  bool zero_gates = false;  // the regime gave this head g == 0
};

// One (sequence, v-head) of T tokens; a random entering state when `with_state` (else zeros).
inline RandomHead random_head(Rng& rng, GateRegime regime, int64_t T, int K, int V,
                              bool with_state) {
  RandomHead head;
  reference::HeadInputs& h = head.in;
  h.T = T;
  h.K = K;
  h.V = V;
  h.q = randn(rng, static_cast<size_t>(T) * K);
  h.k = randn(rng, static_cast<size_t>(T) * K);
  reference::l2_normalize_rows(h.q, K);
  reference::l2_normalize_rows(h.k, K);
  h.v = randn(rng, static_cast<size_t>(T) * V);
  GateSampler gates(regime, rng);
  head.zero_gates = gates.zero_head();
  for (int64_t t = 0; t < T; ++t) {
    h.g.push_back(gates.next());
    h.beta.push_back(sigmoid(rng.normal()));
  }
  h.s0 = with_state ? randn(rng, static_cast<size_t>(K) * V)
                    : std::vector<double>(static_cast<size_t>(K) * V, 0.0);
  h.scale = 1.0 / std::sqrt(static_cast<double>(K));
  return head;
}

// a ([rows][inner]) times b ([inner][cols]).
inline std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b,
                                  int rows, int inner, int cols) {
  std::vector<double> out(static_cast<size_t>(rows) * cols, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int m = 0; m < inner; ++m)
      for (int c = 0; c < cols; ++c) out[r * cols + c] += a[r * inner + m] * b[m * cols + c];
  return out;
}

inline std::vector<double> add(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

inline double frobenius(const std::vector<double>& a) {
  double sum = 0.0;
  for (double x : a) sum += x * x;
  return std::sqrt(sum);
}

// Sizes the outputs of a non-expanding head cannot exceed, from its terms alone (no cancellation):
// the final state's ||s0|| + sum_t |beta_t| |k_t| |v_t|, and o's scale sum_t |q_t| times that to t.
// A rounding error relative to these is what the float64 forms can promise where o or the state
// cancels to far below its terms (e.g. T = 1 with k . q ~ 0).
struct OutputBounds {
  double o = 0.0, state = 0.0;
};
inline OutputBounds output_bounds(const reference::HeadInputs& in) {
  OutputBounds bounds;
  double state = frobenius(in.s0);
  for (int64_t t = 0; t < in.T; ++t) {
    auto row_norm = [&](const std::vector<double>& x, int n) {
      double sum = 0.0;
      for (int i = 0; i < n; ++i) sum += x[t * n + i] * x[t * n + i];
      return std::sqrt(sum);
    };
    state += std::abs(in.beta[t]) * row_norm(in.k, in.K) * row_norm(in.v, in.V);
    bounds.o += std::abs(in.scale) * row_norm(in.q, in.K) * state;
  }
  bounds.state = state;
  return bounds;
}

inline std::string describe(GateRegime regime, int64_t T, int K, int V) {
  return std::string("regime=") + regime_name(regime) + " T=" + std::to_string(T) +
         " K=" + std::to_string(K) + " V=" + std::to_string(V);
}

}  // namespace flashgdn::testing
