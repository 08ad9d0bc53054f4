// The forward's context-parallelism decision (runtime/forward.cpp, decide_cp): segment counts with
// host lengths (exact) and without (a bound), forced and automatic modes. Host code only; built
// when the kernels are.
#ifdef FLASHGDN_WITH_KERNELS
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/forward.h"

namespace flashgdn::detail {
namespace {

Inputs batch_inputs(int64_t batch, int64_t seqlen, int32_t heads, ContextParallel mode, int64_t segment_chunks = 0) {
  Inputs in;
  in.shape = {batch, seqlen, heads, heads, 128, 128};
  in.context_parallelism.mode = mode;
  in.context_parallelism.segment_chunks = segment_chunks;
  return in;
}

TEST(CpDecision, OffNeverSplits) {
  EXPECT_FALSE(decide_cp(batch_inputs(1, 1 << 17, 1, ContextParallel::kOff)).enabled);
}

TEST(CpDecision, ForcedSegmentsInBatchMode) {
  const CpDecision cp = decide_cp(batch_inputs(2, 1000, 2, ContextParallel::kOn, 4));  // 16 chunks each
  EXPECT_TRUE(cp.enabled);
  EXPECT_EQ(cp.segment_chunks, 4);
  EXPECT_EQ(cp.max_segments, 8);
}

TEST(CpDecision, SequencesShorterThanASegmentStayWhole) {
  EXPECT_FALSE(decide_cp(batch_inputs(3, 200, 2, ContextParallel::kOn, 4)).enabled);  // 4 chunks each
}

TEST(CpDecision, VarlenHostLengthsGiveExactCounts) {
  const std::vector<int64_t> cu{0, 0, 65, 1000};  // 0, 2 and 15 chunks
  int32_t device_stand_in = 0;
  Inputs in = batch_inputs(1, 1000, 2, ContextParallel::kOn, 4);
  in.varlen = {&device_stand_in, DType::kI32, 3, cu.data()};
  const CpDecision cp = decide_cp(in);
  EXPECT_TRUE(cp.enabled);
  EXPECT_EQ(cp.max_segments, 0 + 1 + 4);
}

TEST(CpDecision, VarlenWithoutHostLengths) {
  int32_t device_stand_in = 0;
  Inputs in = batch_inputs(1, 1000, 2, ContextParallel::kOn, 4);
  in.varlen = {&device_stand_in, DType::kI32, 3, nullptr};
  const CpDecision forced = decide_cp(in);
  EXPECT_TRUE(forced.enabled);
  EXPECT_GE(forced.max_segments, 5);  // bound on sum ceil(chunks / 4) for any 3 lengths summing to <= 1000
  EXPECT_EQ(forced.max_segments, (1000 / 64 + 3) / 4 + 3 + 1);
  in.context_parallelism.mode = ContextParallel::kAuto;  // the planner needs the lengths
  EXPECT_FALSE(decide_cp(in).enabled);
}

TEST(CpDecision, AutoSplitsOneLongSequenceOverFewHeads) {
  const CpDecision cp = decide_cp(batch_inputs(1, 32768, 2, ContextParallel::kAuto));
  EXPECT_TRUE(cp.enabled);
  EXPECT_GE(cp.max_segments, 2);
  EXPECT_EQ(cp.max_segments, (512 + cp.segment_chunks - 1) / cp.segment_chunks);
}

TEST(CpDecision, AutoKeepsManySequencesWhole) {
  EXPECT_FALSE(decide_cp(batch_inputs(64, 2048, 32, ContextParallel::kAuto)).enabled);
}

}  // namespace
}  // namespace flashgdn::detail
#endif  // FLASHGDN_WITH_KERNELS
