// The CP pipeline of the float64 reference (DESIGN §1, auto-CP) against the token recurrence:
// exact (~1e-12) without decay windows and with a -40 threshold; within the decay bound with the
// default -10 threshold, which must use windows in strong decay and never for g == 0 heads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <stdexcept>
#include <vector>

#include "plan/decay_window.h"
#include "reference_fixtures.h"

namespace flashgdn::testing {
namespace {

using reference::HeadInputs;
using reference::HeadOutputs;
using reference::kChunk;

constexpr double kTight = 1e-12;
constexpr double kNoWindows = -std::numeric_limits<double>::infinity();

struct Segmentation {
  int64_t T;
  std::vector<int64_t> begins;
};

// Single-chunk segments, uneven segments, partial last chunks, a lone partial chunk at the end.
const Segmentation kSegmentations[] = {
    {300, {0}},           {300, {0, 64, 128, 192, 256}}, {300, {0, 128}},
    {300, {0, 192, 256}}, {130, {0, 64, 128}},           {130, {0, 128}},
    {65, {0, 64}},        {64, {0}},
};

TEST(ReferenceCp, ExactWithoutDecayWindows) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (const Segmentation& seg : kSegmentations)
      for (bool with_state : {false, true}) {
        const int K = static_cast<int>(rng.integer(8, 32)), V = static_cast<int>(rng.integer(8, 32));
        SCOPED_TRACE(describe(regime, seg.T, K, V) + " " + segments_text(seg.begins));
        const HeadInputs head = random_head(rng, regime, seg.T, K, V, with_state).in;
        const HeadOutputs naive = reference::recurrent_forward(head);
        const reference::CpForwardResult cp = reference::cp_forward(head, seg.begins, kNoWindows);
        for (bool w : cp.windowed) EXPECT_FALSE(w);
        EXPECT_LE(rel_l2(cp.out.o, naive.o), kTight);
        EXPECT_LE(rel_l2(cp.out.s_final, naive.s_final), kTight);
      }
}

// e^{-40} is far below double precision relative to the states, so windows change nothing.
TEST(ReferenceCp, ThresholdMinus40MatchesRecurrence) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t T = rng.integer(1, 640);
      const int K = static_cast<int>(rng.integer(8, 24)), V = static_cast<int>(rng.integer(8, 24));
      const std::vector<int64_t> begins = random_segments(rng, T, 3);
      SCOPED_TRACE(describe(regime, T, K, V) + " " + segments_text(begins));
      const HeadInputs head = random_head(rng, regime, T, K, V, true).in;
      const HeadOutputs naive = reference::recurrent_forward(head);
      const reference::CpForwardResult cp = reference::cp_forward(head, begins, -40.0);
      EXPECT_LE(rel_l2(cp.out.o, naive.o), kTight);
      EXPECT_LE(rel_l2(cp.out.s_final, naive.s_final), kTight);
    }
}

// With the default threshold, a windowed segment j drops the term Lin_window(S_mid) of its exit
// state, where S_mid is the exact state entering the window: ||Lin_window||_2 <= e^{D} <= e^{-10}
// (each token's map e^{g}(I - b k k^T) has spectral norm <= e^{g}). Later maps do not expand the
// error, so every state is off by at most sum_j e^{-10} ||S_mid_j||_F and each o_t by scale ||q_t||
// times that.
TEST(ReferenceCp, DefaultThresholdStaysWithinDecayBound) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double threshold = plan::kDefaultDecayThreshold;
  int strong_windows = 0;
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 6; ++trial) {
      const int64_t T = rng.integer(kChunk + 1, 16 * kChunk);
      const int K = static_cast<int>(rng.integer(8, 24)), V = static_cast<int>(rng.integer(8, 24));
      const std::vector<int64_t> begins = random_segments(rng, T, 4);
      SCOPED_TRACE(describe(regime, T, K, V) + " " + segments_text(begins));
      RandomHead random = random_head(rng, regime, T, K, V, true);
      HeadInputs& head = random.in;
      for (double& x : head.s0) x *= 10.0;  // a large entering state makes window errors visible

      const HeadOutputs naive = reference::recurrent_forward(head);
      const reference::CpForwardResult cp = reference::cp_forward(head, begins, threshold);

      double bound = 0.0;
      for (size_t j = 0; j + 1 < begins.size(); ++j) {
        const int64_t begin = begins[j], end = begins[j + 1];
        double segment_decay = 0.0;
        for (int64_t t = begin; t < end; ++t) segment_decay += head.g[t];
        EXPECT_EQ(cp.windowed[j], segment_decay <= threshold) << "segment " << j;
        if (random.zero_gates) {
          EXPECT_FALSE(cp.windowed[j]) << "segment " << j;
        }
        if (!cp.windowed[j]) continue;
        strong_windows += regime == GateRegime::kStrong;
        const std::span<const double> gates(head.g.data() + begin, end - begin);
        const int64_t window = *plan::trailing_decay_window(gates, kChunk, threshold);
        const std::vector<double> s_mid =
            reference::recurrent_forward(
                reference::slice_tokens(head, 0, end - window * kChunk, head.s0))
                .s_final;
        bound += std::exp(threshold) * frobenius(s_mid);
      }
      const double slack = 1e-9 * frobenius(naive.s_final) + 1e-12;
      std::vector<double> state_error(cp.out.s_final);
      for (size_t e = 0; e < state_error.size(); ++e) state_error[e] -= naive.s_final[e];
      EXPECT_LE(frobenius(state_error), bound + slack);
      for (int64_t t = 0; t < T; ++t) {
        double error_sq = 0.0, q_sq = 0.0;
        for (int j = 0; j < V; ++j) {
          const double d = cp.out.o[t * V + j] - naive.o[t * V + j];
          error_sq += d * d;
        }
        for (int i = 0; i < K; ++i) q_sq += head.q[t * K + i] * head.q[t * K + i];
        ASSERT_LE(std::sqrt(error_sq), head.scale * std::sqrt(q_sq) * bound + slack)
            << "token " << t;
      }
    }
  EXPECT_GT(strong_windows, 0) << "strong decay never used a decay window";
}

TEST(ReferenceCp, ZeroGateHeadsUseTheExactMap) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const HeadInputs head = random_head(rng, GateRegime::kZero, 1000, 16, 16, true).in;
  const std::vector<int64_t> begins = random_segments(rng, head.T, 2);
  SCOPED_TRACE(segments_text(begins));
  const HeadOutputs naive = reference::recurrent_forward(head);
  const reference::CpForwardResult cp =
      reference::cp_forward(head, begins, plan::kDefaultDecayThreshold);
  for (bool w : cp.windowed) EXPECT_FALSE(w);
  EXPECT_LE(rel_l2(cp.out.o, naive.o), kTight);
  EXPECT_LE(rel_l2(cp.out.s_final, naive.s_final), kTight);
}

TEST(ReferenceCp, RejectsBadSegmentations) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const HeadInputs head = random_head(rng, GateRegime::kWeak, 200, 8, 8, false).in;
  for (const std::vector<int64_t>& begins : std::vector<std::vector<int64_t>>{
           {}, {64}, {0, 32}, {0, 128, 64}, {0, 64, 64}, {0, 256}}) {
    SCOPED_TRACE(segments_text(begins));
    EXPECT_THROW(reference::cp_forward(head, begins, kNoWindows), std::invalid_argument);
  }
}

}  // namespace
}  // namespace flashgdn::testing
