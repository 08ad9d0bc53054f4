// Equal-length packed sequences as batch mode (runtime/common.h uniform_sequence_length, as_batch):
// which calls qualify, and the batch view's sizes and strides (the GPU tests check that the view
// runs without the chunk table and matches the batch call bitwise). Host code only; built when the
// kernels are.
#ifdef FLASHGDN_WITH_KERNELS
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/common.h"

namespace flashgdn::detail {
namespace {

// Varlen inputs over `cu` (host copy given unless `host` is false): q (1, T, 2, 128) with padded
// token rows (stride 3 * 2 * 128), g (1, T, 4).
Inputs varlen_inputs(const std::vector<int64_t>& cu, int64_t seqlen, bool host = true) {
  static int device_offsets = 0;  // stands for the device tensor (never read on the host)
  Inputs in;
  in.shape = {1, seqlen, 2, 4, 128, 128};
  in.varlen.cu_seqlens = &device_offsets;
  in.varlen.num_seqs = static_cast<int64_t>(cu.size()) - 1;
  in.varlen.cu_seqlens_host = host ? cu.data() : nullptr;
  in.q = TensorRef::strided(nullptr, DType::kBF16, {1, seqlen, 2, 128}, {seqlen * 768, 768, 128, 1});
  in.q.data = &device_offsets;
  in.g = TensorRef::contiguous(&device_offsets, DType::kF32, {1, seqlen, 4});
  return in;
}

TEST(BatchView, EqualLengthsFillingTheTokenAxisQualify) {
  const std::vector<int64_t> cu{0, 320, 640, 960};
  EXPECT_EQ(uniform_sequence_length(varlen_inputs(cu, 960)), 320);
  const std::vector<int64_t> one{0, 8192};
  EXPECT_EQ(uniform_sequence_length(varlen_inputs(one, 8192)), 8192);
}

TEST(BatchView, OtherCallsStayVarlen) {
  const std::vector<int64_t> cu{0, 320, 640, 960};
  EXPECT_EQ(uniform_sequence_length(varlen_inputs(cu, 961)), 0);  // padding past the last sequence
  EXPECT_EQ(uniform_sequence_length(varlen_inputs(cu, 960, false)), 0);  // no host copy
  const std::vector<int64_t> uneven{0, 320, 639, 960};
  EXPECT_EQ(uniform_sequence_length(varlen_inputs(uneven, 960)), 0);
  const std::vector<int64_t> empty{0, 0, 0};
  EXPECT_EQ(uniform_sequence_length(varlen_inputs(empty, 0)), 0);
  Inputs batch;
  batch.shape = {4, 256, 2, 4, 128, 128};
  EXPECT_EQ(uniform_sequence_length(batch), 0);
}

TEST(BatchView, TokenAxisSplitKeepsEveryElementsAddress) {
  const std::vector<int64_t> cu{0, 320, 640, 960};
  const Inputs in = varlen_inputs(cu, 960);
  const Inputs batched = as_batch(in, 320);
  EXPECT_FALSE(batched.varlen.present());
  EXPECT_EQ(batched.shape.batch, 3);
  EXPECT_EQ(batched.shape.seqlen, 320);
  EXPECT_EQ(batched.num_sequences(), 3);
  // element (b, t, h, d) of the view is packed token b * 320 + t
  const TensorRef& q = batched.q;
  EXPECT_EQ(q.sizes[0], 3);
  EXPECT_EQ(q.sizes[1], 320);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{319}})
      EXPECT_EQ(b * q.strides[0] + t * q.strides[1] + q.strides[2], (b * 320 + t) * in.q.strides[1] + in.q.strides[2]);
  EXPECT_EQ(batched.g.strides[0], 320 * 4);
  EXPECT_FALSE(batched.beta.present());  // absent tensors stay absent
}

}  // namespace
}  // namespace flashgdn::detail
#endif
