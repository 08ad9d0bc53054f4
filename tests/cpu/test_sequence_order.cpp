// The sequence order's workspace region and the runtime's choice (runtime/common.h input_layout,
// orders_sequences): the region (int32 [N], after the chunk table) exists for varlen calls with a
// chunk table and N <= kMaxOrderedSequences, and the forward and backward workspace sizes hold it
// whether or not the call orders; a call orders without CP, with more items than SMs, unless
// FLASHGDN_SEQUENCE_ORDER=natural ("longest" or unset: the default; any other value: kInvalidArgument,
// whether or not the call would order). Host code only; built when the kernels are (the GPU tests check
// that the order changes no bit: tests/gpu/test_sequence_order.py).
#ifdef FLASHGDN_WITH_KERNELS
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/common.h"

namespace flashgdn::detail {
namespace {

// Varlen inputs of `num_seqs` sequences of 100 tokens (host copy of cu_seqlens given) and Hv v-heads.
struct Packed {
  std::vector<int64_t> cu;
  Inputs in;
};
Packed packed(int64_t num_seqs, int32_t num_v_heads) {
  static int device_offsets = 0;  // stands for the device tensors (never read on the host)
  Packed p;
  for (int64_t i = 0; i <= num_seqs; ++i) p.cu.push_back(100 * i + (i > 0 ? 1 : 0));  // unequal: 101, 100, ...
  const int64_t tokens = p.cu.back();
  p.in.shape = {1, tokens, 1, num_v_heads, 128, 128};
  p.in.varlen.cu_seqlens = &device_offsets;
  p.in.varlen.num_seqs = num_seqs;
  p.in.varlen.cu_seqlens_host = p.cu.data();
  return p;
}

// FLASHGDN_SEQUENCE_ORDER set (or unset) for a scope.
struct OrderEnv {
  explicit OrderEnv(const char* value) {
    if (value != nullptr) setenv("FLASHGDN_SEQUENCE_ORDER", value, 1);
    else unsetenv("FLASHGDN_SEQUENCE_ORDER");
  }
  ~OrderEnv() { unsetenv("FLASHGDN_SEQUENCE_ORDER"); }
};

// orders_sequences' answer, the call expected to succeed.
bool orders(const Inputs& in, const InputLayout& layout, bool cp) {
  bool longest_first = true;
  const Status status = orders_sequences(in, layout, cp, longest_first);
  EXPECT_TRUE(status.ok()) << status.message();
  return longest_first;
}

TEST(SequenceOrder, RegionAfterTheChunkTable) {
  const Packed ten = packed(10, 32);
  const InputLayout layout = input_layout(ten.in);
  EXPECT_TRUE(layout.chunk_table);
  EXPECT_TRUE(layout.order_table);
  EXPECT_EQ(layout.chunk_offsets, 0u);
  EXPECT_EQ(layout.sequence_order, 256u);  // 11 int32 offsets, aligned
  EXPECT_EQ(layout.end, 512u);             // 10 int32 ranks, aligned
}

TEST(SequenceOrder, RegionUpToTheCap) {
  const Packed at_cap = packed(kern::kMaxOrderedSequences, 1);
  const InputLayout layout = input_layout(at_cap.in);
  EXPECT_TRUE(layout.order_table);
  const std::size_t offsets_bytes = align_up((kern::kMaxOrderedSequences + 1) * sizeof(int32_t));
  EXPECT_EQ(layout.sequence_order, offsets_bytes);
  EXPECT_EQ(layout.end, offsets_bytes + align_up(kern::kMaxOrderedSequences * sizeof(int32_t)));

  const Packed over = packed(kern::kMaxOrderedSequences + 1, 1);  // natural order: no region
  const InputLayout natural = input_layout(over.in);
  EXPECT_TRUE(natural.chunk_table);
  EXPECT_FALSE(natural.order_table);
  EXPECT_EQ(natural.end, align_up((kern::kMaxOrderedSequences + 2) * sizeof(int32_t)));
  OrderEnv unset(nullptr);
  EXPECT_FALSE(orders(over.in, natural, false));
}

TEST(SequenceOrder, NoRegionWithoutTheChunkTable) {
  const Packed ten = packed(10, 32);
  const InputLayout decode = input_layout(ten.in, false);  // the recurrent decode
  EXPECT_FALSE(decode.order_table);
  EXPECT_EQ(decode.end, 0u);
  Inputs batch = ten.in;
  batch.varlen = Varlen{};
  batch.shape.batch = 10;
  const InputLayout batch_layout = input_layout(batch);
  EXPECT_FALSE(batch_layout.chunk_table);
  EXPECT_FALSE(batch_layout.order_table);
  EXPECT_EQ(batch_layout.end, 0u);
  OrderEnv unset(nullptr);
  EXPECT_FALSE(orders(batch, batch_layout, false));
  EXPECT_FALSE(orders(ten.in, decode, false));
}

TEST(SequenceOrder, OrdersWithoutCpPastOneWave) {
  OrderEnv unset(nullptr);
  const int64_t sms = num_sms();
  const Packed more = packed(sms / 32 + 1, 32);  // N Hv > SMs
  const InputLayout layout = input_layout(more.in);
  EXPECT_TRUE(orders(more.in, layout, false));
  EXPECT_FALSE(orders(more.in, layout, true));  // CP: its segments are balanced by the cut
  const Packed one_wave = packed(sms / 4, 4);             // N Hv <= SMs: every item in the first wave
  EXPECT_FALSE(orders(one_wave.in, input_layout(one_wave.in), false));
  Packed empty = packed(sms, 2);  // only empty sequences (host copy): no chunk, no kernel between
  for (int64_t& offset : empty.cu) offset = 0;
  EXPECT_FALSE(orders(empty.in, input_layout(empty.in), false));
  empty.in.varlen.cu_seqlens_host = nullptr;  // without the host copy the chunk bound is T / 64 + N
  EXPECT_TRUE(orders(empty.in, input_layout(empty.in), false));
}

TEST(SequenceOrder, EnvironmentForcesTheNaturalOrder) {
  const Packed more = packed(num_sms(), 2);
  const InputLayout layout = input_layout(more.in);
  {
    OrderEnv natural("natural");
    EXPECT_FALSE(orders(more.in, layout, false));
    EXPECT_EQ(input_layout(more.in).end, layout.end);  // the workspace does not depend on it
  }
  for (const char* value : {"longest", ""}) {  // the default, spelt out or empty
    OrderEnv longest(value);
    EXPECT_TRUE(orders(more.in, layout, false)) << "FLASHGDN_SEQUENCE_ORDER=\"" << value << "\"";
  }
}

TEST(SequenceOrder, EnvironmentRefusesOtherValues) {
  const Packed more = packed(num_sms(), 2);
  Inputs never_orders = more.in;  // batch mode: a call that never orders fails too
  never_orders.varlen = Varlen{};
  never_orders.shape.batch = 10;
  const Inputs& batch = never_orders;
  for (const char* value : {"NATURAL", "off", "0", "longest_first", "natural "}) {
    OrderEnv bad(value);
    for (const Inputs* in : {&more.in, &batch}) {
      bool longest_first = true;
      const Status status = orders_sequences(*in, input_layout(*in), false, longest_first);
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << "FLASHGDN_SEQUENCE_ORDER=\"" << value << "\"";
      EXPECT_NE(status.message().find("FLASHGDN_SEQUENCE_ORDER"), std::string::npos) << status.message();
      EXPECT_FALSE(longest_first);
    }
  }
}

}  // namespace
}  // namespace flashgdn::detail
#endif
