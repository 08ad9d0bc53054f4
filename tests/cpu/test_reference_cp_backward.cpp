// Backward context parallelism of the float64 reference (reference/cp_backward.h) against the
// token-level reverse mode (backward_tokens, the oracle):
//   - a span's backward affine map dS_start = dS* + Mᵀ dS_end, and the dh-only chunk recurrence
//     that computes it, equal the token-level gradient w.r.t. the span's entering state (~1e-12),
//     and its linear part is the transpose of affine_span's forward M;
//   - the whole backward CP pipeline equals backward_tokens for every gradient without decay
//     windows and with a -40 threshold (~1e-11);
//   - with the default -10 threshold the boundary state gradients and dh0 stay within the e^{-10}
//     window bound, the per-token gradients differ from the exact ones by exactly the backward of
//     those boundary errors, strong decay uses windows and g == 0 heads never do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan/decay_window.h"
#include "reference/backward.h"
#include "reference/cp_backward.h"
#include "reference_fixtures.h"

namespace flashgdn::testing {
namespace {

using reference::HeadInputs;
using reference::kChunk;
namespace bwd = reference::bwd;

constexpr double kTight = 1e-12;  // span maps vs token level
constexpr double kGrad = 1e-11;   // whole-head gradients vs token level (as the chunked test)
constexpr double kNoWindows = -std::numeric_limits<double>::infinity();

// ||a - b|| / ||b||, evaluated on a / max|b| so that strongly decayed values (down to the
// subnormal range) do not lose the comparison to underflow of the squares.
double scaled_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (double x : b) s = std::max(s, std::abs(x));
  if (s == 0.0) {
    double m = 0.0;
    for (double x : a) m = std::max(m, std::abs(x));
    return m;
  }
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += ((a[i] - b[i]) / s) * ((a[i] - b[i]) / s);
    den += (b[i] / s) * (b[i] / s);
  }
  return std::sqrt(num / den);
}

// The Frobenius norm without underflow of the squares.
double norm2(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) m = std::max(m, std::abs(e));
  if (m == 0.0) return 0.0;
  double sum = 0.0;
  for (double e : x) sum += (e / m) * (e / m);
  return m * std::sqrt(sum);
}

std::vector<double> sub(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

std::vector<double> rows(const std::vector<double>& x, int64_t begin, int64_t end, int dim) {
  return {x.begin() + begin * dim, x.begin() + end * dim};
}

struct Case {
  RandomHead random;
  std::vector<double> d_o;   // [T][V]
  std::vector<double> d_sT;  // [K][V] or empty
};

Case make_case(Rng& rng, GateRegime regime, int64_t T, int K, int V, bool with_state) {
  Case c{random_head(rng, regime, T, K, V, with_state), {}, {}};
  c.d_o = randn(rng, static_cast<size_t>(T) * V);
  if (with_state) c.d_sT = randn(rng, static_cast<size_t>(K) * V);
  return c;
}

int64_t segment_end(const HeadInputs& h, const std::vector<int64_t>& begins, size_t j) {
  return j + 1 < begins.size() ? begins[j + 1] : h.T;
}

// The exact ∂L/∂(state entering token t0) from the token-level oracle (it does not depend on the
// state, so the slice enters with zeros).
std::vector<double> exact_state_grad_at(const HeadInputs& h, const std::vector<double>& d_o,
                                        const std::vector<double>& d_sT, int64_t t0) {
  const std::vector<double> zero(static_cast<size_t>(h.K) * h.V, 0.0);
  if (t0 == h.T) return d_sT.empty() ? zero : d_sT;
  return bwd::backward_tokens(reference::slice_tokens(h, t0, h.T, zero), rows(d_o, t0, h.T, h.V),
                              d_sT)
      .ds0;
}

// Exact entering states S_j of every segment, by the token recurrence.
std::vector<std::vector<double>> exact_entering_states(const HeadInputs& h,
                                                       const std::vector<int64_t>& begins) {
  std::vector<std::vector<double>> states{h.s0};
  for (size_t j = 0; j + 1 < begins.size(); ++j)
    states.push_back(reference::recurrent_forward(
                         reference::slice_tokens(h, begins[j], begins[j + 1], states.back()))
                         .s_final);
  return states;
}

// dg through the reverse cumsum carries ~1e-15 absolute cancellation error per element whose true
// value can be tiny under strong decay (see ReferenceBackward.ChunkedMatchesTokenLevel, whose rule
// this is): relative L2 or, failing that, an absolute bound on the scale of dk.
void expect_dg_close(const std::vector<double>& got, const std::vector<double>& want,
                     const std::vector<double>& dk_scale, double tol) {
  double max_err = 0.0, max_dk = 1.0;
  for (size_t i = 0; i < want.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - want[i]));
  for (double x : dk_scale) max_dk = std::max(max_dk, std::abs(x));
  EXPECT_TRUE(scaled_rel(got, want) < tol || max_err < 0.1 * tol * max_dk)
      << "dg: relative L2 " << scaled_rel(got, want) << ", max abs error " << max_err;
}

void expect_grads_close(const bwd::HeadGrads& got, const bwd::HeadGrads& want, double tol) {
  EXPECT_LT(scaled_rel(got.dq, want.dq), tol) << "dq";
  EXPECT_LT(scaled_rel(got.dk, want.dk), tol) << "dk";
  EXPECT_LT(scaled_rel(got.dv, want.dv), tol) << "dv";
  expect_dg_close(got.dg, want.dg, want.dk, tol);
  EXPECT_LT(scaled_rel(got.dbeta, want.dbeta), tol) << "dbeta";
  EXPECT_LT(scaled_rel(got.ds0, want.ds0), tol) << "dh0";
}

// A random span [c_begin, c_end) of the head's chunks; half of them end with the (possibly
// partial) last chunk.
std::pair<int64_t, int64_t> random_span(Rng& rng, int64_t T) {
  const int64_t nc = reference::num_chunks(T);
  const int64_t c_end = rng.uniform() < 0.5 ? nc : rng.integer(1, nc);
  return {rng.integer(0, c_end - 1), c_end};
}

// ---------------------------------------------------------------------------------------------

TEST(ReferenceCpBackward, SpanMapMatchesTokenLevelStateGradient) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t T = trial == 0 ? 65 : rng.integer(1, 400);
      const int K = static_cast<int>(rng.integer(8, 24)), V = static_cast<int>(rng.integer(8, 24));
      const Case c = make_case(rng, regime, T, K, V, true);
      const HeadInputs& h = c.random.in;
      const auto [c_begin, c_end] = random_span(rng, T);
      const int64_t begin = c_begin * kChunk, end = std::min(c_end * kChunk, T);
      SCOPED_TRACE(describe(regime, T, K, V) + " span of chunks [" + std::to_string(c_begin) +
                   ", " + std::to_string(c_end) + ")");
      const std::vector<double> ds_end = randn(rng, static_cast<size_t>(K) * V);
      // The token-level oracle on the span alone: dO restricted to it, the exit gradient dS_end.
      const HeadInputs span = reference::slice_tokens(h, begin, end, h.s0);
      const std::vector<double> span_d_o = rows(c.d_o, begin, end, V);
      const std::vector<double> token_start = bwd::backward_tokens(span, span_d_o, ds_end).ds0;
      const std::vector<double> token_star = bwd::backward_tokens(span, span_d_o, {}).ds0;

      const bwd::BackwardAffineMap map = bwd::backward_affine_span(h, c.d_o, c_begin, c_end);
      const std::vector<double> affine_start =
          add(map.ds_star, bwd::transpose_times(map.m, ds_end, K, V));
      EXPECT_LE(scaled_rel(map.ds_star, token_star), kTight) << "dS*";
      EXPECT_LE(scaled_rel(affine_start, token_start), kTight) << "dS* + M^T dS_end";
      EXPECT_LE(scaled_rel(bwd::span_state_grad(h, c.d_o, c_begin, c_end, ds_end), token_start),
                kTight)
          << "dh-only recurrence from dS_end";
    }
}

TEST(ReferenceCpBackward, DhOnlyLinearPartIsMTransposed) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 6; ++trial) {
      const int64_t T = rng.integer(1, 300);
      const int K = static_cast<int>(rng.integer(8, 24)), V = static_cast<int>(rng.integer(8, 24));
      const HeadInputs h = random_head(rng, regime, T, K, V, true).in;
      const auto [c_begin, c_end] = random_span(rng, T);
      const int64_t begin = c_begin * kChunk, end = std::min(c_end * kChunk, T);
      SCOPED_TRACE(describe(regime, T, K, V) + " span of chunks [" + std::to_string(c_begin) +
                   ", " + std::to_string(c_end) + ")");
      const std::vector<double> ds_end = randn(rng, static_cast<size_t>(K) * V);
      const std::vector<double> no_d_o(static_cast<size_t>(T) * V, 0.0);
      // Mᵀ dS_end sums terms of size up to e^{D} ‖dS_end‖ (D = the span's gate sum, ‖M‖₂ <= e^D)
      // and can cancel to far less (β near 1 makes I - β k kᵀ nearly singular), so the error is
      // measured against that scale; below 1e-290 ‖dS_end‖ the values are subnormal-range noise.
      const std::vector<double> linear = bwd::span_state_grad(h, {}, c_begin, c_end, ds_end);
      double span_decay = 0.0;
      for (int64_t t = begin; t < end; ++t) span_decay += h.g[t];
      const double scale = std::exp(span_decay) * norm2(ds_end);
      auto expect_close = [&](const std::vector<double>& want, const char* what) {
        EXPECT_LE(norm2(sub(linear, want)),
                  kTight * std::max(norm2(want), scale) + 1e-290 * norm2(ds_end))
            << what << ": |error| " << norm2(sub(linear, want)) << ", |want| " << norm2(want)
            << ", e^D |dS_end| " << scale;
      };
      expect_close(bwd::transpose_times(reference::affine_span(h, c_begin, c_end).m, ds_end, K, V),
                   "vs affine_span's M^T");
      expect_close(bwd::backward_tokens(reference::slice_tokens(h, begin, end, h.s0),
                                        rows(no_d_o, begin, end, V), ds_end)
                       .ds0,
                   "vs token level with dO = 0");
      // With dS_end = 0 nothing but dO contributes; with dO = 0 and dS_end = 0 the result is 0.
      for (double x : bwd::span_state_grad(h, no_d_o, c_begin, c_end)) ASSERT_EQ(x, 0.0);
    }
}

// Single-chunk segments, uneven segments, partial last chunks, a lone partial chunk at the end.
struct Segmentation {
  int64_t T;
  std::vector<int64_t> begins;
};
const Segmentation kSegmentations[] = {
    {300, {0}},           {300, {0, 64, 128, 192, 256}}, {300, {0, 128}},
    {300, {0, 192, 256}}, {130, {0, 64, 128}},           {130, {0, 128}},
    {65, {0, 64}},        {64, {0}},                     {256, {0, 64, 192}},
};

TEST(ReferenceCpBackward, ExactWithoutDecayWindows) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (const Segmentation& seg : kSegmentations)
      for (bool with_state : {false, true}) {
        const int K = static_cast<int>(rng.integer(8, 24));
        const int V = static_cast<int>(rng.integer(8, 24));
        SCOPED_TRACE(describe(regime, seg.T, K, V) + " " + segments_text(seg.begins) +
                     (with_state ? " h0, dS_T" : ""));
        const Case c = make_case(rng, regime, seg.T, K, V, with_state);
        const HeadInputs& h = c.random.in;
        const bwd::HeadGrads oracle = bwd::backward_tokens(h, c.d_o, c.d_sT);
        const bwd::CpBackwardResult cp = bwd::cp_backward(h, c.d_o, c.d_sT, seg.begins, kNoWindows);
        ASSERT_EQ(cp.windowed.size(), seg.begins.size());
        for (size_t j = 0; j < seg.begins.size(); ++j) {
          EXPECT_FALSE(cp.windowed[j]) << "segment " << j;
          EXPECT_FALSE(cp.forward_windowed[j]) << "segment " << j;
        }
        expect_grads_close(cp.grads, oracle, kGrad);
        // The scanned boundary gradients themselves.
        ASSERT_EQ(cp.entering_state_grads.size(), seg.begins.size() + 1);
        for (size_t j = 1; j < seg.begins.size(); ++j)
          EXPECT_LE(scaled_rel(cp.entering_state_grads[j],
                               exact_state_grad_at(h, c.d_o, c.d_sT, seg.begins[j])),
                    kGrad)
              << "dS entering segment " << j;
      }
}

// e^{-40} is far below double precision relative to the states and their gradients.
TEST(ReferenceCpBackward, ThresholdMinus40MatchesTokenLevel) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t T = rng.integer(1, 640);
      const int K = static_cast<int>(rng.integer(8, 20)), V = static_cast<int>(rng.integer(8, 20));
      const std::vector<int64_t> begins = random_segments(rng, T, 3);
      SCOPED_TRACE(describe(regime, T, K, V) + " " + segments_text(begins));
      const Case c = make_case(rng, regime, T, K, V, true);
      const bwd::HeadGrads oracle = bwd::backward_tokens(c.random.in, c.d_o, c.d_sT);
      const bwd::CpBackwardResult cp = bwd::cp_backward(c.random.in, c.d_o, c.d_sT, begins, -40.0);
      expect_grads_close(cp.grads, oracle, kGrad);
    }
}

// With the default threshold and the exact entering states, a windowed segment j drops
// M_leadᵀ D_mid from dS_j, where D_mid is the exact gradient w.r.t. the state leaving its leading
// window: ‖M_leadᵀ D_mid‖_F <= e^{D} ‖D_mid‖_F <= e^{-10} ‖D_mid‖_F (each token's map
// e^{g}(I - b k kᵀ) has spectral norm <= e^{g}). Unwindowed segments pass errors on through M_jᵀ,
// which does not expand them, so every boundary gradient and dh0 is off by at most the sum of
// the bounds of the windowed segments at or after it. The per-token gradients of segment i are
// linear in (dO, dS_{i+1}): they must differ from the exact ones by exactly the backward of
// segment i with dO = 0 and dS_T = (error of dS_{i+1}).
TEST(ReferenceCpBackward, DefaultThresholdStaysWithinDecayBound) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double threshold = plan::kDefaultDecayThreshold;
  int strong_windows = 0, weak_windows = 0;
  double max_error_over_bound = 0.0;
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 5; ++trial) {
      const int64_t T = rng.integer(2 * kChunk + 1, 12 * kChunk);
      const int K = static_cast<int>(rng.integer(8, 16)), V = static_cast<int>(rng.integer(8, 16));
      std::vector<int64_t> begins = random_segments(rng, T, 5);
      if (begins.size() < 2) begins = {0, kChunk};
      SCOPED_TRACE(describe(regime, T, K, V) + " " + segments_text(begins));
      Case c = make_case(rng, regime, T, K, V, true);
      const HeadInputs& h = c.random.in;
      for (double& x : c.d_sT) x *= 10.0;  // a large exit gradient makes window errors visible
      const size_t J = begins.size();

      const std::vector<std::vector<double>> states = exact_entering_states(h, begins);
      const bwd::CpBackwardResult cp =
          bwd::cp_backward_from_states(h, c.d_o, c.d_sT, begins, states, threshold);
      const bwd::HeadGrads oracle = bwd::backward_tokens(h, c.d_o, c.d_sT);

      // Window decisions and their bounds.
      std::vector<double> bound(J + 1, 0.0);  // bound[j]: error bound of dS_j
      EXPECT_FALSE(cp.windowed[0]);
      for (size_t j = J; j-- > 1;) {
        const int64_t begin = begins[j], end = segment_end(h, begins, j);
        const std::span<const double> gates(h.g.data() + begin, end - begin);
        const std::optional<int64_t> window = plan::leading_decay_window(gates, kChunk, threshold);
        EXPECT_EQ(cp.windowed[j], window.has_value()) << "segment " << j;
        if (c.random.zero_gates) {
          EXPECT_FALSE(cp.windowed[j]) << "segment " << j;
        }
        bound[j] = bound[j + 1];
        if (!cp.windowed[j]) continue;
        strong_windows += regime == GateRegime::kStrong;
        weak_windows += regime == GateRegime::kWeak;
        const int64_t mid = std::min(begin + *window * kChunk, end);
        bound[j] += std::exp(threshold) * frobenius(exact_state_grad_at(h, c.d_o, c.d_sT, mid));
      }
      bound[0] = bound[1];

      // Boundary gradients and dh0.
      std::vector<std::vector<double>> error(J + 1);
      for (size_t j = 0; j <= J; ++j) {
        const int64_t t0 = j < J ? begins[j] : T;
        const std::vector<double> exact = exact_state_grad_at(h, c.d_o, c.d_sT, t0);
        error[j] = sub(cp.entering_state_grads[j], exact);
        EXPECT_LE(frobenius(error[j]), bound[j] + 1e-11 * frobenius(exact))
            << "dS entering segment " << j;
        if (bound[j] > 0)
          max_error_over_bound = std::max(max_error_over_bound, frobenius(error[j]) / bound[j]);
      }
      EXPECT_LE(frobenius(sub(cp.grads.ds0, oracle.ds0)), bound[0] + 1e-11 * frobenius(oracle.ds0))
          << "dh0";

      // Per-token gradients: exact + backward of the boundary error, segment by segment.
      bwd::HeadGrads predicted = oracle;
      for (size_t i = 0; i < J; ++i) {
        const int64_t begin = begins[i], end = segment_end(h, begins, i);
        const std::vector<double> no_d_o(static_cast<size_t>(end - begin) * V, 0.0);
        const bwd::HeadGrads delta = bwd::backward_tokens(
            reference::slice_tokens(h, begin, end, states[i]), no_d_o, error[i + 1]);
        for (int64_t t = 0; t < end - begin; ++t) {
          for (int k = 0; k < K; ++k) {
            predicted.dq[(begin + t) * K + k] += delta.dq[t * K + k];
            predicted.dk[(begin + t) * K + k] += delta.dk[t * K + k];
          }
          for (int v = 0; v < V; ++v) predicted.dv[(begin + t) * V + v] += delta.dv[t * V + v];
          predicted.dg[begin + t] += delta.dg[t];
          predicted.dbeta[begin + t] += delta.dbeta[t];
        }
        if (i == 0) predicted.ds0 = add(predicted.ds0, delta.ds0);
      }
      expect_grads_close(cp.grads, predicted, kGrad);

      // The whole pipeline (forward windows for the entering states too) makes the same backward
      // window decisions and stays finite.
      const bwd::CpBackwardResult full = bwd::cp_backward(h, c.d_o, c.d_sT, begins, threshold);
      EXPECT_EQ(full.windowed, cp.windowed);
      for (const std::vector<double>* x : {&full.grads.dq, &full.grads.dk, &full.grads.dv,
                                           &full.grads.dg, &full.grads.dbeta, &full.grads.ds0})
        EXPECT_TRUE(all_finite(*x));
    }
  std::printf("[          ] largest boundary dS error / window bound: %.3g\n",
              max_error_over_bound);
  EXPECT_GT(strong_windows, 0) << "strong decay never used a decay window";
  EXPECT_GT(weak_windows + strong_windows, 0);
}

// At the default threshold a g == 0 head never uses a window in either direction (no decay ever
// reaches it), so the whole pipeline is exact.
TEST(ReferenceCpBackward, ZeroGateHeadsNeverUseAWindow) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 2; ++trial) {
    const int64_t T = rng.integer(300, 1000);
    const std::vector<int64_t> begins = random_segments(rng, T, 2);
    SCOPED_TRACE("T=" + std::to_string(T) + " " + segments_text(begins));
    const Case c = make_case(rng, GateRegime::kZero, T, 16, 16, true);
    const bwd::CpBackwardResult cp = bwd::cp_backward(c.random.in, c.d_o, c.d_sT, begins,
                                                      plan::kDefaultDecayThreshold);
    for (size_t j = 0; j < begins.size(); ++j) {
      EXPECT_FALSE(cp.windowed[j]) << "segment " << j;
      EXPECT_FALSE(cp.forward_windowed[j]) << "segment " << j;
    }
    expect_grads_close(cp.grads, bwd::backward_tokens(c.random.in, c.d_o, c.d_sT), kGrad);
  }
}

TEST(ReferenceCpBackward, RejectsBadArguments) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Case c = make_case(rng, GateRegime::kWeak, 200, 8, 8, false);
  const HeadInputs& h = c.random.in;
  for (const std::vector<int64_t>& begins : std::vector<std::vector<int64_t>>{
           {}, {64}, {0, 32}, {0, 128, 64}, {0, 64, 64}, {0, 256}}) {
    SCOPED_TRACE(segments_text(begins));
    EXPECT_THROW(bwd::cp_backward(h, c.d_o, c.d_sT, begins, kNoWindows), std::invalid_argument);
  }
  EXPECT_THROW(bwd::cp_backward_from_states(h, c.d_o, c.d_sT, {0, 64}, {h.s0}, kNoWindows),
               std::invalid_argument);
  EXPECT_THROW(bwd::cp_backward(h, std::vector<double>(10, 0.0), c.d_sT, {0, 64}, kNoWindows),
               std::invalid_argument);
}

}  // namespace
}  // namespace flashgdn::testing
