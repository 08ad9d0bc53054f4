// Auto-CP planning (src/plan/cp_plan.h, cost_model.h): the modelled makespan, the on/off decision,
// the sqrt growth of the segment length, the structure of the segmentation, and the guarantee
// that the planner never returns a plan the model says is slower than no CP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <vector>

#include "plan/cp_plan.h"
#include "test_util.h"

namespace flashgdn::plan {
namespace {

using flashgdn::testing::announced_seed;
using flashgdn::testing::Rng;

// Segments contiguous and chunk-aligned from offset 0 to the sequence end, indices in order,
// empty sequences without segments, the runtime's cut: ceil(C / L) segments of a cut sequence,
// balanced (longer first, sizes within one chunk, none longer than L, the last possibly partial).
void expect_valid_segmentation(const CpPlan& plan) {
  ASSERT_EQ(static_cast<int64_t>(plan.first_segment.size()), plan.num_sequences() + 1);
  ASSERT_EQ(plan.first_segment.front(), 0);
  ASSERT_EQ(plan.first_segment.back(), static_cast<int64_t>(plan.segments.size()));
  bool any_cut = false;
  for (int64_t i = 0; i < plan.num_sequences(); ++i) {
    SCOPED_TRACE(::testing::Message() << "sequence " << i);
    const int64_t length = plan.sequence_lengths[i];
    const int64_t n = plan.num_segments_of(i);
    ASSERT_EQ(n == 0, length == 0);
    any_cut = any_cut || n > 1;
    int64_t offset = 0;
    std::vector<int64_t> begins;
    for (int64_t j = 0; j < n; ++j) {
      const Segment& s = plan.segments[plan.first_segment[i] + j];
      ASSERT_EQ(s.sequence, i);
      ASSERT_EQ(s.index, j);
      ASSERT_EQ(s.offset, offset);
      ASSERT_EQ(s.offset % kChunkSize, 0);
      ASSERT_GE(s.tokens, 1);
      if (j + 1 < n) {
        ASSERT_EQ(s.tokens % kChunkSize, 0);
      }
      if (n > 1) {
        ASSERT_EQ(n, (num_chunks_of(length) + plan.target_segment_chunks - 1) / plan.target_segment_chunks);
        ASSERT_LE(s.num_chunks(), plan.target_segment_chunks);
      }
      if (j > 0) {
        const int64_t previous = plan.segments[plan.first_segment[i] + j - 1].num_chunks();
        ASSERT_LE(s.num_chunks(), previous);
        ASSERT_GE(s.num_chunks() + 1, previous);
      }
      begins.push_back(offset);
      offset += s.tokens;
    }
    ASSERT_EQ(offset, length);
    ASSERT_EQ(plan.segment_begins(i), begins);
  }
  ASSERT_EQ(plan.enabled, any_cut);
  ASSERT_EQ(plan.enabled, plan.target_segment_chunks > 0);
}

// The wave schedule: items sorted by decreasing cost, wave w holds items wP+1 .. (w+1)P and starts
// when the previous wave ends (its length: its first item's cost).
double wave_schedule_makespan(std::vector<double> items, int64_t slots) {
  std::sort(items.begin(), items.end(), std::greater<>());
  double makespan = 0.0;
  for (size_t first = 0; first < items.size(); first += static_cast<size_t>(slots))
    makespan += items[first];
  return makespan;
}

TEST(PlanMakespan, EqualItemsRunInWaves) {
  for (const int64_t slots : {1, 7, 132}) {
    for (const int64_t count : {1, 5, 131, 132, 133, 264, 265, 1000}) {
      const double expected = 2.5 * static_cast<double>((count + slots - 1) / slots);
      EXPECT_DOUBLE_EQ(makespan_us({{2.5, count}}, slots), expected)
          << count << " items on " << slots << " slots";
    }
  }
  EXPECT_EQ(makespan_us({}, 132), 0.0);
}

// Short items past full waves cost a wave of their own (sequences of different lengths cut at one
// L give such mixes): 256 items of 31 and 16 of 16 on 132 slots take 31 + 31 + 16.
TEST(PlanMakespan, ATailPastFullWavesTakesAWave) {
  EXPECT_DOUBLE_EQ(makespan_us({{31.0, 256}, {16.0, 16}}, 132), 78.0);
  EXPECT_DOUBLE_EQ(makespan_us({{32.0, 256}}, 132), 64.0);
}

TEST(PlanMakespan, TheWaveScheduleWithinGrahamsBound) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t slots = rng.integer(1, 140);
    std::vector<WorkGroup> groups(static_cast<size_t>(rng.integer(1, 6)));
    std::vector<double> items;
    double longest = 0.0, total = 0.0;
    for (WorkGroup& g : groups) {
      g = {rng.uniform(0.5, 50.0), rng.integer(0, 300)};
      for (int64_t k = 0; k < g.count; ++k) items.push_back(g.cost_us);
      if (g.count > 0) longest = std::max(longest, g.cost_us);
      total += g.cost_us * static_cast<double>(g.count);
    }
    const double modelled = makespan_us(groups, slots);
    const double average = total / static_cast<double>(slots);
    // rounding: the two sum up to 300 x 6 costs in different orders (makespans reach ~4e4 us)
    const double rounding = 1e-12 * (average + longest);
    EXPECT_NEAR(modelled, std::max(wave_schedule_makespan(items, slots), average), rounding);
    EXPECT_GE(modelled, longest);
    // a schedule's makespan, so at most Graham's list-scheduling bound
    EXPECT_LE(modelled, average + longest + rounding);
  }
}

TEST(PlanCp, CorrectionSliceColumnsNarrowOnlyWithinOneWave) {
  // 16 columns (8 CTAs a state) while sequences x v-heads x 8 fit the SMs, else 32 (4 a state).
  EXPECT_EQ(correction_slice_cols(1, 8, 132), 16);    // (2,8) one sequence: 64 CTAs
  EXPECT_EQ(correction_slice_cols(1, 16, 132), 16);   // 128 CTAs
  EXPECT_EQ(correction_slice_cols(2, 8, 132), 16);    // 128
  EXPECT_EQ(correction_slice_cols(1, 32, 132), 32);   // 256 would be two waves: 128 at 32 columns
  EXPECT_EQ(correction_slice_cols(3, 8, 132), 32);    // 192
  EXPECT_EQ(correction_slice_cols(1, 17, 136), 16);   // exactly one wave
  EXPECT_EQ(correction_slice_cols(1, 17, 135), 32);
}

TEST(PlanCp, OffWhenSequencesTimesHeadsFillTheSms) {
  struct Case {
    int64_t sequences, length;
    int32_t heads;
  };
  for (const Case& c : {Case{4, 8192, 33}, Case{8, 4096, 32}, Case{1, 32768, 132},
                        Case{64, 2048, 16}, Case{2, 16384, 64}, Case{16, 32768, 16}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.sequences << " x " << c.length << " tokens, Hv " << c.heads);
    const std::vector<int64_t> lengths(static_cast<size_t>(c.sequences), c.length);
    const CpPlan plan = plan_cp({lengths, c.heads, 132});
    EXPECT_FALSE(plan.enabled);
    EXPECT_EQ(static_cast<int64_t>(plan.segments.size()), c.sequences);
    expect_valid_segmentation(plan);
  }
}

TEST(PlanCp, OnForOneSequenceOfEightHeadsAnd32kTokens) {
  const std::vector<int64_t> lengths{32768};
  const CpProblem problem{lengths, 8, 132};
  const CostModel model;
  const CpPlan plan = plan_cp(problem, model);
  const double cp_us = predict_time_us(plan, model);
  const double no_cp_us = predict_time_us(no_cp_plan(problem), model);
  std::printf(
      "1 x 32768, Hv 8: %lld segments of ~%lld chunks, modelled %.1f us vs %.1f us without CP\n",
      static_cast<long long>(plan.segments.size()),
      static_cast<long long>(plan.target_segment_chunks), cp_us, no_cp_us);
  ASSERT_TRUE(plan.enabled);
  EXPECT_GE(plan.segments.size(), 8u);
  EXPECT_LT(cp_us, 0.5 * no_cp_us);
  expect_valid_segmentation(plan);
}

// Only per-chunk work (lambda_1 = fused + state pass) and per-boundary correction (lambda_2):
// T(n) = ceil(C / n) * lambda_1 + (n - 1) * lambda_2, smallest at
// L = C / n = sqrt(C * lambda_2 / lambda_1).
CostModel two_coefficient_model(double lambda_1, double lambda_2) {
  CostModel model;
  model.fused_chunk_us = lambda_1 / 2;
  model.state_chunk_us = lambda_1 / 2;
  model.state_m_chunk_us = 0.0;
  model.fused_item_us = model.state_item_us = model.correction_item_us = 0.0;
  model.correction_step_us = lambda_2;
  model.correction_m_step_us = 0.0;
  model.gate_scan_chunk_us = 0.0;
  model.launch_us = 0.0;
  return model;
}

TEST(PlanCp, SegmentLengthFollowsTheSqrtLaw) {
  for (const double ratio : {1.0, 4.0}) {  // lambda_2 / lambda_1
    const CostModel model = two_coefficient_model(1.0, ratio);
    for (const int64_t chunks : {256, 1024, 4096, 16384}) {
      const std::vector<int64_t> lengths{chunks * kChunkSize};
      const CpPlan plan = plan_cp({lengths, 1, 132}, model);
      ASSERT_TRUE(plan.enabled);
      const double optimum = std::sqrt(static_cast<double>(chunks) * ratio);
      EXPECT_NEAR(static_cast<double>(plan.target_segment_chunks) / optimum, 1.0, 0.1)
          << chunks << " chunks, lambda_2 / lambda_1 = " << ratio;
    }
  }
}

TEST(PlanCp, SegmentLengthGrowsLikeSqrtOfLengthWithDefaultCosts) {
  // One v-head, lengths long enough that the shortest segment the model allows (min_segment_chunks)
  // does not bind: the best segment counts stay within a wave of 132 SMs, where the sqrt law holds
  // (beyond a wave the average-load bound caps the count instead).
  std::vector<int64_t> segment_chunks;
  for (const int64_t length : {32768, 131072, 524288}) {
    const std::vector<int64_t> lengths{length};
    const CpPlan plan = plan_cp({lengths, 1, 132});
    ASSERT_TRUE(plan.enabled) << length;
    std::printf("1 x %lld, Hv 1: segment %lld chunks, %lld segments\n",
                static_cast<long long>(length), static_cast<long long>(plan.target_segment_chunks),
                static_cast<long long>(plan.segments.size()));
    segment_chunks.push_back(plan.target_segment_chunks);
  }
  // Four times the length: about twice the segment length (sqrt), far from 4x (fixed count) or
  // 1x (fixed length).
  for (size_t i = 1; i < segment_chunks.size(); ++i) {
    const double growth = static_cast<double>(segment_chunks[i]) / segment_chunks[i - 1];
    EXPECT_GT(growth, 1.5);
    EXPECT_LT(growth, 2.7);
  }
}

TEST(PlanCp, MixedLongAndShortSequencesSplitOnlyTheLongOnes) {
  struct Case {
    std::vector<int64_t> lengths;
    int32_t heads;
  };
  for (const Case& c : {Case{{131072, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, 8},
                        Case{{2048, 65536, 0, 100, 4096}, 4}, Case{{28672, 4096}, 8}}) {
    const CpPlan plan = plan_cp({c.lengths, c.heads, 132});
    expect_valid_segmentation(plan);
    ASSERT_TRUE(plan.enabled);
    const int64_t longest = *std::max_element(c.lengths.begin(), c.lengths.end());
    for (int64_t i = 0; i < plan.num_sequences(); ++i) {
      const int64_t chunks = num_chunks_of(c.lengths[i]);
      if (c.lengths[i] == longest) {
        EXPECT_GT(plan.num_segments_of(i), 1) << "sequence " << i;
      }
      // A sequence of at most L chunks is never cut.
      if (chunks <= plan.target_segment_chunks) {
        EXPECT_LE(plan.num_segments_of(i), 1) << "sequence " << i;
      }
    }
    EXPECT_EQ(plan.num_segments_of(0) > 1, c.lengths[0] == longest);
  }
}

TEST(PlanCp, SplitPlansAreChunkAlignedAndCoverEachSequence) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> lengths(static_cast<size_t>(rng.integer(1, 40)));
    for (int64_t& n : lengths) n = rng.uniform() < 0.1 ? 0 : rng.integer(1, 40000);
    CpOptions options;
    options.min_segment_chunks = rng.integer(1, 8);
    const CpProblem problem{lengths, static_cast<int32_t>(rng.integer(1, 64)), 132};
    const CpPlan split = split_plan(problem, rng.integer(1, 700), options);
    expect_valid_segmentation(split);
    for (int64_t i = 0; i < split.num_sequences(); ++i) {
      if (split.enabled && num_chunks_of(lengths[i]) <= split.target_segment_chunks) {
        EXPECT_LE(split.num_segments_of(i), 1);
      }
    }
    const CpPlan planned = plan_cp(problem, CostModel{}, options);
    expect_valid_segmentation(planned);
    if (planned.enabled) {
      EXPECT_GE(planned.target_segment_chunks, options.min_segment_chunks);
    }
    expect_valid_segmentation(no_cp_plan(problem, options));
  }
}

TEST(PlanCp, NeverSlowerThanNoCpOverARandomSweep) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int32_t head_counts[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};
  int enabled = 0, trials = 0;
  for (const CostModel& model : {CostModel{}, CostModel::backward()}) {
    for (int trial = 0; trial < 300; ++trial, ++trials) {
      const int64_t work = rng.integer(1, 256);  // sequences x heads
      int32_t heads = head_counts[rng.integer(0, 8)];
      while (heads > work) heads /= 2;
      std::vector<int64_t> lengths(static_cast<size_t>(std::max<int64_t>(1, work / heads)));
      for (int64_t& n : lengths) n = rng.integer(2048, 131072);
      CpOptions options;
      options.assumed_m_heads = static_cast<int32_t>(rng.integer(-1, heads));
      const CpProblem problem{lengths, heads, 132};
      const CpPlan plan = plan_cp(problem, model, options);
      const double cp_us = predict_time_us(plan, model);
      const double no_cp_us = predict_time_us(no_cp_plan(problem, options), model);
      SCOPED_TRACE(::testing::Message() << lengths.size() << " sequences, Hv " << heads);
      EXPECT_LE(cp_us, no_cp_us);
      if (plan.enabled) {
        ++enabled;
        EXPECT_LT(cp_us, (1.0 - options.min_relative_gain) * no_cp_us);
      }
      expect_valid_segmentation(plan);
    }
  }
  std::printf("CP chosen in %d of %d sweep problems\n", enabled, trials);
  EXPECT_GT(enabled, 0);
  EXPECT_LT(enabled, trials);
}

TEST(PlanCp, ChoosesTheFastestSplitOfASingleSequence) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  const CostModel model;
  const CpOptions options;
  for (int trial = 0; trial < 40; ++trial) {
    const std::vector<int64_t> lengths{rng.integer(2048, 32768)};
    const CpProblem problem{lengths, static_cast<int32_t>(int64_t{1} << rng.integer(0, 2)), 132};
    const CpPlan plan = plan_cp(problem, model, options);
    const double chosen_us = predict_time_us(plan, model);
    const double budget_us =
        (1.0 - options.min_relative_gain) * predict_time_us(no_cp_plan(problem), model);
    SCOPED_TRACE(::testing::Message() << lengths[0] << " tokens, Hv " << problem.num_v_heads);
    // every length the planner may choose: none shorter than the model's minimum segment
    for (int64_t l = model.min_segment_chunks; l <= num_chunks_of(lengths[0]); ++l) {
      const double split_us = predict_time_us(split_plan(problem, l, options), model);
      if (plan.enabled) {
        EXPECT_LE(chosen_us, split_us) << "segment length " << l;
      } else {
        EXPECT_GE(split_us, budget_us) << "segment length " << l;
      }
    }
  }
}

TEST(PlanCp, FewerExactMHeadsModelCheaperCp) {
  const std::vector<int64_t> lengths{32768, 16384};
  const CpProblem problem{lengths, 16, 132};
  const CostModel model;
  double previous_us = 0.0;
  for (const int32_t m_heads : {0, 4, 8, 16}) {
    CpOptions options;
    options.assumed_m_heads = m_heads;
    const double us = predict_time_us(split_plan(problem, 16, options), model);
    EXPECT_GE(us, previous_us) << m_heads << " heads with exact M";
    previous_us = us;
  }
  CpOptions all;
  EXPECT_DOUBLE_EQ(previous_us, predict_time_us(split_plan(problem, 16, all), model));
}

TEST(PlanCp, TinyAndEmptyProblemsStayWhole) {
  for (const std::vector<int64_t>& lengths :
       {std::vector<int64_t>{}, std::vector<int64_t>{0, 0}, std::vector<int64_t>{1},
        std::vector<int64_t>{7 * kChunkSize}, std::vector<int64_t>{0, 100, 0}}) {
    const CpPlan plan = plan_cp({lengths, 1, 132});
    EXPECT_FALSE(plan.enabled);
    expect_valid_segmentation(plan);
  }
}

TEST(PlanCp, RejectsBadArguments) {
  const std::vector<int64_t> good{4096};
  const std::vector<int64_t> negative{4096, -1};
  EXPECT_THROW(plan_cp({negative, 8, 132}), std::invalid_argument);
  EXPECT_THROW(plan_cp({good, 0, 132}), std::invalid_argument);
  EXPECT_THROW(plan_cp({good, 8, 0}), std::invalid_argument);
  CpOptions options;
  options.assumed_m_heads = 9;
  EXPECT_THROW(plan_cp({good, 8, 132}, CostModel{}, options), std::invalid_argument);
  options = {};
  options.min_relative_gain = 1.0;
  EXPECT_THROW(plan_cp({good, 8, 132}, CostModel{}, options), std::invalid_argument);
  EXPECT_THROW(split_plan({good, 8, 132}, 0), std::invalid_argument);
  CostModel model;
  model.heavy_ctas_per_sm = 0;
  EXPECT_THROW(plan_cp({good, 8, 132}, model), std::invalid_argument);
  model = {};
  model.min_segment_chunks = 0;
  EXPECT_THROW(plan_cp({good, 8, 132}, model), std::invalid_argument);
  model = {};
  model.fused_chunk_us = -1.0;
  EXPECT_THROW(predict_time_us(no_cp_plan({good, 8, 132}), model), std::invalid_argument);
}

// The model's shortest segment bounds plan_cp's target length (options can only raise it): with
// the correction free and the fused chunk dear, the planner cuts as finely as it is allowed.
TEST(PlanCp, NeverCutsShorterThanTheModelsMinimumSegment) {
  CostModel model;
  model.fused_chunk_us = 10.0;
  model.fused_item_us = model.state_item_us = model.correction_item_us = 0.0;
  model.correction_step_us = model.correction_m_step_us = model.launch_us = 0.0;
  model.gate_scan_chunk_us = 0.0;
  const std::vector<int64_t> lengths{64 * 256};
  for (const int64_t shortest : {4, 8, 16}) {  // at most 64 segments: one wave
    model.min_segment_chunks = shortest;
    for (const int64_t requested : {1, 4, 12}) {
      CpOptions options;
      options.min_segment_chunks = requested;
      const CpPlan plan = plan_cp({lengths, 1, 132}, model, options);
      ASSERT_TRUE(plan.enabled);
      const int64_t bound = std::max(shortest, requested);
      EXPECT_GE(plan.target_segment_chunks, bound);
      EXPECT_LT(plan.target_segment_chunks, 2 * bound) << "the finest cut allowed";
    }
  }
}

}  // namespace
}  // namespace flashgdn::plan
