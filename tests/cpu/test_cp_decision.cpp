// The forward's context-parallelism decision (runtime/forward.cpp, decide_cp): segment counts with
// host lengths (exact) and without (a bound), forced and automatic modes; and the fused kernel the
// automatic choice takes (auto_forward_kernel: v5 where the resident items fill 40% of the SMs without CP),
// and which of them fill the inverse cache (forms_reusable_inverse).
// Host code only (no GPU: 132 SMs assumed); built when the kernels are.
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

TEST(CpDecision, GivenCutCountsAsThePlannerDoes) {  // the backward with the forward's CP cache
  const std::vector<int64_t> cu{0, 0, 65, 1000};  // 0, 2 and 15 chunks
  int32_t device_stand_in = 0;
  Inputs in = batch_inputs(1, 1000, 2, ContextParallel::kOff, 0);  // the backward's own options do not matter
  in.varlen = {&device_stand_in, DType::kI32, 3, cu.data()};
  const CpDecision given = given_cp(in, 4);
  EXPECT_TRUE(given.enabled);
  EXPECT_EQ(given.segment_chunks, 4);
  in.context_parallelism = {ContextParallel::kOn, 4, -10.f};
  EXPECT_EQ(given.max_segments, decide_cp(in).max_segments);
  in.varlen.cu_seqlens_host = nullptr;  // a bound, the same as the forward's
  EXPECT_EQ(given_cp(in, 4).max_segments, decide_cp(in).max_segments);
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

TEST(AutoForwardKernel, ResidentItemsWeighLengths) {
  EXPECT_DOUBLE_EQ(resident_items(batch_inputs(4, 8192, 32, ContextParallel::kAuto)), 128.0);
  const std::vector<int64_t> cu{0, 28672, 32768};  // 448 and 64 chunks
  int32_t device_stand_in = 0;
  Inputs in = batch_inputs(1, 32768, 64, ContextParallel::kAuto);
  in.varlen = {&device_stand_in, DType::kI32, 2, cu.data()};
  EXPECT_NEAR(resident_items(in), (448.0 + 64.0) / 448.0 * 64, 1e-9);
  in.varlen = {&device_stand_in, DType::kI32, 2, nullptr};  // lengths unknown
  EXPECT_EQ(resident_items(in), 0.0);
}

TEST(AutoForwardKernel, InverseInsideFromTwoFifthsOfTheSmsWithoutCp) {
  const Inputs full = batch_inputs(4, 8192, 32, ContextParallel::kAuto);  // 128 of 132 SMs
  EXPECT_EQ(auto_forward_kernel(full, false, ShardPhase::kNone), FusedKernel::kInverseInside);
  EXPECT_EQ(auto_forward_kernel(full, true, ShardPhase::kNone), FusedKernel::kRegisterState);
  EXPECT_EQ(auto_forward_kernel(full, false, ShardPhase::kMaps), FusedKernel::kRegisterState);
  const Inputs partial = batch_inputs(1, 2048, 64, ContextParallel::kAuto);  // 64 of 132 SMs
  EXPECT_EQ(auto_forward_kernel(partial, false, ShardPhase::kNone), FusedKernel::kInverseInside);
  const Inputs few = batch_inputs(1, 2048, 48, ContextParallel::kAuto);  // 48: below 52.8
  EXPECT_EQ(auto_forward_kernel(few, false, ShardPhase::kNone), FusedKernel::kRegisterState);
  const std::vector<int64_t> cu{0, 28672, 32768};  // 73 resident of 128 items
  int32_t device_stand_in = 0;
  Inputs mixed = batch_inputs(1, 32768, 64, ContextParallel::kAuto);
  mixed.varlen = {&device_stand_in, DType::kI32, 2, cu.data()};
  EXPECT_EQ(auto_forward_kernel(mixed, false, ShardPhase::kNone), FusedKernel::kInverseInside);
  const std::vector<int64_t> skewed{0, 31744, 32768};  // 496 and 16 chunks: 33 resident of 64 items
  Inputs long_one = batch_inputs(1, 32768, 32, ContextParallel::kAuto);
  long_one.varlen = {&device_stand_in, DType::kI32, 2, skewed.data()};
  EXPECT_EQ(auto_forward_kernel(long_one, false, ShardPhase::kNone), FusedKernel::kRegisterState);
}

// Which forwards can fill the inverse cache: v4 (its chunk inverse writes the backward's format, with or
// without CP) and v5 without CP (its kKeepsInverse kernel: one main-pass item a chunk), with the
// default bf16 (fp16-merged) inverse only; never a decode-sized call (no inverse at all) or another kernel.
TEST(InverseCache, FormedByV4AndByV5WithoutCp) {
  ForwardLayout layout;
  const kern::InverseKind bf16 = kern::InverseKind::kBF16, f32 = kern::InverseKind::kF32;
  EXPECT_TRUE(forms_reusable_inverse(layout, FusedKernel::kRegisterState, bf16));
  EXPECT_TRUE(forms_reusable_inverse(layout, FusedKernel::kInverseInside, bf16));
  EXPECT_FALSE(forms_reusable_inverse(layout, FusedKernel::kRegisterState, f32));
  EXPECT_FALSE(forms_reusable_inverse(layout, FusedKernel::kInverseInside, f32));
  for (FusedKernel other : {FusedKernel::kMmaSync, FusedKernel::kWgmma, FusedKernel::kWarpSpecialized})
    EXPECT_FALSE(forms_reusable_inverse(layout, other, bf16));
  layout.cp.enabled = true;
  EXPECT_TRUE(forms_reusable_inverse(layout, FusedKernel::kRegisterState, bf16));
  EXPECT_FALSE(forms_reusable_inverse(layout, FusedKernel::kInverseInside, bf16));
  layout.cp.enabled = false;
  layout.decode = true;
  EXPECT_FALSE(forms_reusable_inverse(layout, FusedKernel::kRegisterState, bf16));
  EXPECT_FALSE(forms_reusable_inverse(layout, FusedKernel::kInverseInside, bf16));
}

}  // namespace
}  // namespace flashgdn::detail
#endif  // FLASHGDN_WITH_KERNELS
