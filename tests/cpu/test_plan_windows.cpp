// Decay windows per (segment, v-head) (src/plan/segment_windows.h): heads with g == 0 always need
// the exact M, strong decay gives short windows, and every window equals the smallest chunk count
// whose brute-force gate sum reaches the threshold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

#include "plan/segment_windows.h"
#include "test_util.h"

namespace flashgdn::plan {
namespace {

using flashgdn::testing::announced_seed;
using flashgdn::testing::GateRegime;
using flashgdn::testing::GateSampler;
using flashgdn::testing::kAllRegimes;
using flashgdn::testing::regime_name;
using flashgdn::testing::Rng;

// Host gates [sequence][head][token].
using Gates = std::vector<std::vector<std::vector<double>>>;

GateSource source_of(const Gates& gates) {
  return [&gates](int64_t sequence, int32_t head) -> std::span<const double> {
    return gates[sequence][head];
  };
}

Gates constant_gates(const std::vector<int64_t>& lengths, const std::vector<double>& per_head) {
  Gates gates;
  for (const int64_t n : lengths) {
    gates.emplace_back();
    for (const double g : per_head) gates.back().emplace_back(static_cast<size_t>(n), g);
  }
  return gates;
}

// Smallest n whose n chunks, counted from the end (trailing) or the start (leading) of the
// segment, have a gate sum <= threshold; each chunk's sum taken from scratch.
std::optional<int64_t> brute_force_window(const std::vector<double>& gates, const Segment& s,
                                          bool trailing, double threshold) {
  const int64_t chunks = s.num_chunks();
  for (int64_t n = 1; n <= chunks; ++n) {
    double sum = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t c = trailing ? chunks - 1 - k : k;
      for (int64_t t = c * kChunkSize; t < std::min((c + 1) * kChunkSize, s.tokens); ++t)
        sum += gates[s.offset + t];
    }
    if (sum <= threshold) return n;
  }
  return std::nullopt;
}

// Checks every entry of `table`, and its M-pair counts, against the brute force.
void expect_matches_brute_force(const CpPlan& plan, const Gates& gates,
                                const DecayWindowTable& table, double threshold) {
  int64_t forward_m = 0, backward_m = 0;
  for (int64_t i = 0; i < plan.num_sequences(); ++i) {
    const int64_t first = plan.first_segment[i], last = plan.first_segment[i + 1] - 1;
    for (int64_t s = first; s <= last; ++s) {
      const Segment& segment = plan.segments[s];
      for (int32_t h = 0; h < plan.num_v_heads; ++h) {
        SCOPED_TRACE(::testing::Message()
                     << "sequence " << i << " segment " << segment.index << " head " << h);
        const SegmentWindows& w = table.at(s, h);
        const auto check = [&](const DecayWindow& window, bool crosses, bool trailing,
                               int64_t& m_count) {
          if (!crosses) {
            EXPECT_EQ(window.chunks, 0);
            EXPECT_FALSE(window.needs_m);
            return;
          }
          const std::optional<int64_t> expected =
              brute_force_window(gates[i][h], segment, trailing, threshold);
          EXPECT_EQ(window.needs_m, !expected.has_value());
          EXPECT_EQ(window.chunks, expected.value_or(segment.num_chunks()));
          if (!expected) ++m_count;
        };
        check(w.forward, s < last, true, forward_m);
        check(w.backward, s > first, false, backward_m);
      }
    }
  }
  EXPECT_EQ(table.forward_m_count, forward_m);
  EXPECT_EQ(table.backward_m_count, backward_m);
}

int64_t inner_boundaries(const CpPlan& plan) {
  int64_t boundaries = 0;
  for (int64_t i = 0; i < plan.num_sequences(); ++i)
    boundaries += std::max<int64_t>(0, plan.num_segments_of(i) - 1);
  return boundaries;
}

TEST(PlanDecayWindows, ZeroGateHeadsAlwaysNeedM) {
  const std::vector<int64_t> lengths{40000, 0, 9000, 300};
  const CpPlan plan = split_plan({lengths, 3, 132}, 16);
  ASSERT_TRUE(plan.enabled);
  const Gates gates = constant_gates(lengths, {0.0, 0.0, 0.0});
  const DecayWindowTable table = segment_decay_windows(plan, source_of(gates));
  EXPECT_EQ(table.forward_m_count, inner_boundaries(plan) * 3);
  EXPECT_EQ(table.backward_m_count, inner_boundaries(plan) * 3);
  for (int64_t i = 0; i < plan.num_sequences(); ++i) {
    const int64_t first = plan.first_segment[i], last = plan.first_segment[i + 1] - 1;
    for (int64_t s = first; s <= last; ++s)
      for (int32_t h = 0; h < 3; ++h) {
        const SegmentWindows& w = table.at(s, h);
        EXPECT_EQ(w.forward.needs_m, s < last);
        EXPECT_EQ(w.backward.needs_m, s > first);
        if (s < last) {
          EXPECT_EQ(w.forward.chunks, plan.segments[s].num_chunks());
        }
      }
  }
  expect_matches_brute_force(plan, gates, table, kDefaultDecayThreshold);
}

TEST(PlanDecayWindows, StrongDecayGivesShortWindows) {
  // Per chunk: -0.5 * 64 = -32 (one chunk reaches -10), -0.05 * 64 = -3.2 (four chunks: -12.8),
  // -0.01 * 64 = -0.64 (sixteen chunks: -10.24), and g == 0 (never).
  const std::vector<int64_t> lengths{65536};
  const CpPlan plan = split_plan({lengths, 4, 132}, 32);
  ASSERT_TRUE(plan.enabled);
  const Gates gates = constant_gates(lengths, {-0.5, -0.05, -0.01, 0.0});
  const DecayWindowTable table = segment_decay_windows(plan, source_of(gates));
  const int64_t expected[] = {1, 4, 16};
  for (int64_t s = 0; s < static_cast<int64_t>(plan.segments.size()); ++s) {
    for (int32_t h = 0; h < 3; ++h) {
      if (s + 1 < static_cast<int64_t>(plan.segments.size())) {
        EXPECT_EQ(table.at(s, h).forward.chunks, expected[h]);
        EXPECT_FALSE(table.at(s, h).forward.needs_m);
      }
      if (s > 0) {
        EXPECT_EQ(table.at(s, h).backward.chunks, expected[h]);
        EXPECT_FALSE(table.at(s, h).backward.needs_m);
      }
    }
  }
  EXPECT_EQ(table.forward_m_count, inner_boundaries(plan));  // the g == 0 head only
  EXPECT_EQ(table.backward_m_count, inner_boundaries(plan));
}

TEST(PlanDecayWindows, WindowsMatchABruteForceSumInEveryRegime) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (const GateRegime regime : kAllRegimes) {
    SCOPED_TRACE(regime_name(regime));
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<int64_t> lengths(static_cast<size_t>(rng.integer(1, 5)));
      for (int64_t& n : lengths) n = rng.uniform() < 0.15 ? 0 : rng.integer(1, 12000);
      const int32_t heads = static_cast<int32_t>(rng.integer(1, 6));
      const CpPlan plan = split_plan({lengths, heads, 132}, rng.integer(1, 40));
      Gates gates;
      for (const int64_t n : lengths) {
        gates.emplace_back();
        for (int32_t h = 0; h < heads; ++h) {
          GateSampler sampler(regime, rng);
          gates.back().emplace_back();
          for (int64_t t = 0; t < n; ++t) gates.back().back().push_back(sampler.next());
        }
      }
      const double threshold = rng.uniform() < 0.5 ? kDefaultDecayThreshold : rng.uniform(-30, -1);
      const DecayWindowTable table = segment_decay_windows(plan, source_of(gates), threshold);
      expect_matches_brute_force(plan, gates, table, threshold);
    }
  }
}

TEST(PlanDecayWindows, UncutSequencesNeedNoWindow) {
  const std::vector<int64_t> lengths{5000, 0, 64};
  const CpPlan plan = no_cp_plan({lengths, 2, 132});
  const Gates gates = constant_gates(lengths, {0.0, -1.0});
  const DecayWindowTable table = segment_decay_windows(plan, source_of(gates));
  EXPECT_EQ(table.forward_m_count, 0);
  EXPECT_EQ(table.backward_m_count, 0);
  for (const SegmentWindows& w : table.windows) {
    EXPECT_EQ(w.forward.chunks, 0);
    EXPECT_EQ(w.backward.chunks, 0);
  }
}

TEST(PlanDecayWindows, RejectsBadArguments) {
  const std::vector<int64_t> lengths{4096};
  const CpPlan plan = split_plan({lengths, 1, 132}, 8);
  const Gates gates = constant_gates(lengths, {-0.1});
  EXPECT_THROW(segment_decay_windows(plan, source_of(gates), 0.0), std::invalid_argument);
  EXPECT_THROW(segment_decay_windows(plan, source_of(gates), std::nan("")), std::invalid_argument);
  const Gates short_gates = constant_gates({4000}, {-0.1});
  EXPECT_THROW(segment_decay_windows(plan, source_of(short_gates)), std::invalid_argument);
  // -infinity disables windows: every crossing needs M.
  const DecayWindowTable table =
      segment_decay_windows(plan, source_of(gates), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(table.forward_m_count, inner_boundaries(plan));
}

}  // namespace
}  // namespace flashgdn::plan
