#include "runtime/common.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "plan/cp_plan.h"

namespace flashgdn::detail {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

bool may_have_padding(const Inputs& in) {
  if (!in.varlen.present()) return false;
  const int64_t* cu = in.varlen.cu_seqlens_host;
  return cu == nullptr || cu[in.varlen.num_seqs] < in.shape.seqlen;
}

int64_t chunk_bound(const Inputs& in) {
  const int64_t T = in.shape.seqlen;
  if (!in.varlen.present()) return in.shape.batch * ((T + 63) / 64);
  if (const int64_t* cu = in.varlen.cu_seqlens_host) {
    int64_t chunks = 0;
    for (int64_t i = 0; i < in.varlen.num_seqs; ++i) chunks += (cu[i + 1] - cu[i] + 63) / 64;
    return chunks;
  }
  return T / 64 + in.varlen.num_seqs;
}

int64_t uniform_sequence_length(const Inputs& in) {
  const int64_t* cu = in.varlen.cu_seqlens_host;
  if (!in.varlen.present() || cu == nullptr || in.varlen.num_seqs < 1 || cu[0] != 0) return 0;
  const int64_t n = in.varlen.num_seqs, length = cu[1];
  if (length <= 0 || length * n != in.shape.seqlen) return 0;
  for (int64_t i = 1; i <= n; ++i)
    if (cu[i] != i * length) return 0;
  return length;
}

TensorRef split_token_axis(const TensorRef& t, int64_t batch, int64_t length) {
  if (!t.present()) return t;
  TensorRef split = t;
  split.sizes[0] = batch;
  split.sizes[1] = length;
  split.strides[0] = t.strides[1] * length;
  return split;
}

Inputs as_batch(const Inputs& in, int64_t length) {
  const int64_t n = in.varlen.num_seqs;
  Inputs batched = in;
  batched.varlen = Varlen{};
  batched.shape.batch = n;
  batched.shape.seqlen = length;
  for (TensorRef* t : {&batched.q, &batched.k, &batched.v, &batched.g, &batched.beta}) *t = split_token_axis(*t, n, length);
  return batched;
}

int32_t num_sms() {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

int32_t cp_slice_cols(int64_t num_sequences, int32_t num_v_heads) {
  if (const char* forced = std::getenv("FLASHGDN_CP_SLICE_COLS"); forced != nullptr && *forced != '\0')
    return std::strcmp(forced, "16") == 0 ? 16 : std::strcmp(forced, "32") == 0 ? 32 : 0;  // 0: the launch fails
  return plan::correction_slice_cols(num_sequences, num_v_heads, num_sms());
}

Status check_device() {
  int device = 0, major = 0, minor = 0;
  if (auto s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  if (auto s = cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                           "cudaDeviceGetAttribute");
      !s.ok())
    return s;
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0)
    return {StatusCode::kNotBuilt, "flashgdn's kernels are built for sm_90a (H100/H200); device " +
                                       std::to_string(device) + " has compute capability " +
                                       std::to_string(major) + "." + std::to_string(minor)};
  return {};
}

Status check_workspace(const void* workspace, std::size_t bytes, std::size_t needed) {
  if (bytes < needed)
    return {StatusCode::kWorkspaceTooSmall,
            "workspace: " + std::to_string(bytes) + " bytes given, " + std::to_string(needed) + " needed"};
  if (needed > 0 && workspace == nullptr) return {StatusCode::kInvalidArgument, "workspace: null pointer"};
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0)
    return {StatusCode::kInvalidArgument, "workspace: must be 256-byte aligned"};
  return {};
}

InverseCacheLayout inverse_cache_layout(const Inputs& in) {
  const Shape& s = in.shape;
  const auto tokens_heads = static_cast<std::size_t>(s.batch * s.seqlen * s.num_v_heads);
  const auto chunk_heads = static_cast<std::size_t>(chunk_bound(in) * s.num_v_heads);
  InverseCacheLayout layout;
  std::size_t offset = 0;
  layout.inverse = offset;
  offset = align_up(offset + tokens_heads * 64 * 2);
  layout.gated_inverse = offset;
  offset = align_up(offset + tokens_heads * 64 * 2);
  layout.chunk_gates = offset;
  offset = align_up(offset + chunk_heads * 128 * sizeof(float));
  layout.window_terms = offset;
  layout.bytes = align_up(offset + chunk_heads * sizeof(float));
  return layout;
}

Status check_inverse_cache_size(const TensorRef& cache, const InverseCacheLayout& layout) {
  if (!cache.present() || static_cast<std::size_t>(cache.sizes[0]) == layout.bytes) return {};
  return {StatusCode::kInvalidArgument, "inverse_cache: " + std::to_string(cache.sizes[0]) +
                                            " bytes given, this problem's cache has " + std::to_string(layout.bytes) +
                                            " (forward_inverse_cache_bytes of the forward with the same inputs)"};
}

void bind_inverse_cache(kern::ForwardParams& p, const TensorRef& cache, const InverseCacheLayout& layout) {
  auto* base = static_cast<unsigned char*>(cache.data);
  p.inverse = base + layout.inverse;
  p.inverse_rows_fp16 = true;
  p.gated_inverse_out = base + layout.gated_inverse;
  p.chunk_gates = reinterpret_cast<float*>(base + layout.chunk_gates);
  p.chunk_window_terms = reinterpret_cast<float*>(base + layout.window_terms);
}

kern::RowStrides row_strides(const TensorRef& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }

kern::ElemKind elem_kind(const Inputs& in) {
  return in.q.dtype == DType::kBF16 ? kern::ElemKind::kBF16 : kern::ElemKind::kF16;
}

InputLayout input_layout(const Inputs& in, bool chunk_table) {
  const Shape& s = in.shape;
  InputLayout layout;
  std::size_t offset = 0;
  layout.chunk_table = in.varlen.present() && chunk_table;
  if (layout.chunk_table) {
    layout.chunk_offsets = offset;
    offset = align_up(offset + static_cast<std::size_t>(in.varlen.num_seqs + 1) * sizeof(int32_t));
  }
  layout.order_table = layout.chunk_table && in.varlen.num_seqs <= kern::kMaxOrderedSequences;
  if (layout.order_table) {
    layout.sequence_order = offset;
    offset = align_up(offset + static_cast<std::size_t>(in.varlen.num_seqs) * sizeof(int32_t));
  }
  if (in.use_qk_l2norm_in_kernel) {
    const std::size_t qk_bytes = static_cast<std::size_t>(s.batch * s.seqlen * s.num_qk_heads) * 128 * 2;
    layout.q_normalized = offset;
    offset = align_up(offset + qk_bytes);
    layout.k_normalized = offset;
    offset = align_up(offset + qk_bytes);
  }
  layout.end = offset;
  return layout;
}

Status orders_sequences(const Inputs& in, const InputLayout& layout, bool cp, bool& longest_first) {
  longest_first = false;
  const char* forced = std::getenv("FLASHGDN_SEQUENCE_ORDER");
  const bool unset = forced == nullptr || *forced == '\0' || std::strcmp(forced, "longest") == 0;
  if (!unset && std::strcmp(forced, "natural") != 0)
    return {StatusCode::kInvalidArgument,
            std::string("FLASHGDN_SEQUENCE_ORDER: \"") + forced + "\" is none of \"longest\", \"natural\" (or unset)"};
  // no chunks (the host copy shows only empty sequences): nothing to order, and no chunk inverse or gate
  // kernel runs between item_offsets and the per-item kernels, which read the order before their wait
  longest_first = unset && layout.order_table && !cp && in.varlen.num_seqs * in.shape.num_v_heads > num_sms() &&
                  chunk_bound(in) > 0;
  return {};
}

Status prepare_inputs(const Inputs& in, const InputLayout& layout, unsigned char* ws, cudaStream_t stream,
                      kern::ForwardParams& p, int32_t* segment_offsets, int64_t segment_chunks, bool longest_first) {
  const Shape& shape = in.shape;
  const kern::ElemKind elem = elem_kind(in);
  p.q = in.q.data;
  p.k = in.k.data;
  p.q_strides = row_strides(in.q);
  p.k_strides = row_strides(in.k);
  if (in.use_qk_l2norm_in_kernel) {
    const auto launch = elem == kern::ElemKind::kBF16 ? kern::launch_l2norm_rows<kern::ElemKind::kBF16>
                                                      : kern::launch_l2norm_rows<kern::ElemKind::kF16>;
    const kern::RowStrides packed{shape.seqlen * shape.num_qk_heads * 128, shape.num_qk_heads * 128, 128};
    p.q = ws + layout.q_normalized;
    p.k = ws + layout.k_normalized;
    if (auto s = cuda_status(launch(in.q.data, shape.batch, shape.seqlen, shape.num_qk_heads, in.q.strides[0],
                                    in.q.strides[1], in.q.strides[2], ws + layout.q_normalized, stream),
                             "l2norm(q)");
        !s.ok())
      return s;
    if (auto s = cuda_status(launch(in.k.data, shape.batch, shape.seqlen, shape.num_qk_heads, in.k.strides[0],
                                    in.k.strides[1], in.k.strides[2], ws + layout.k_normalized, stream),
                             "l2norm(k)");
        !s.ok())
      return s;
    p.q_strides = packed;
    p.k_strides = packed;
  }
  p.v = in.v.data;
  p.v_strides = row_strides(in.v);
  p.g = static_cast<const float*>(in.g.data);
  p.g_strides = row_strides(in.g);
  p.beta = in.beta.data;
  p.beta_strides = row_strides(in.beta);
  p.beta_is_bf16 = in.beta.dtype == DType::kBF16;
  p.initial_state = in.initial_state.data;
  p.initial_state_bf16 = in.initial_state.dtype == DType::kBF16;
  p.initial_state_slots = static_cast<const int32_t*>(in.initial_state_indices.data);
  for (int i = 0; i < 4; ++i) p.initial_state_strides[i] = in.initial_state.strides[i];
  p.state_vk = in.state_layout == StateLayout::kVK;
  p.batch = shape.batch;
  p.seqlen = shape.seqlen;
  p.num_seqs = in.num_sequences();
  p.num_qk_heads = shape.num_qk_heads;
  p.num_v_heads = shape.num_v_heads;
  p.scale = in.effective_scale();
  p.cu_seqlens = in.varlen.cu_seqlens;
  p.cu_seqlens_is_i64 = in.varlen.dtype == DType::kI64;
  p.chunk_offsets = layout.chunk_table ? reinterpret_cast<int32_t*>(ws + layout.chunk_offsets) : nullptr;
  int32_t* sequence_order =
      longest_first && layout.order_table ? reinterpret_cast<int32_t*>(ws + layout.sequence_order) : nullptr;
  p.sequence_order = sequence_order;
  p.max_chunks = chunk_bound(in);
  if (layout.chunk_table)
    return cuda_status(kern::launch_chunk_offsets(p, segment_offsets, segment_chunks, sequence_order, stream),
                       "chunk_offsets");
  return {};
}

}  // namespace flashgdn::detail

namespace flashgdn::detail {

namespace {

// Calls launch.template operator()<E, I>() for the runtime (elem, inverse): the explicit
// instantiations of a launcher template (src/kernels/sm90/instantiations/).
template <typename Launch>
cudaError_t launch_variant(kern::ElemKind elem, kern::InverseKind inverse, Launch&& launch) {
  using kern::ElemKind;
  using kern::InverseKind;
  const bool inverse_f32 = inverse == InverseKind::kF32;
  if (elem == ElemKind::kBF16)
    return inverse_f32 ? launch.template operator()<ElemKind::kBF16, InverseKind::kF32>()
                       : launch.template operator()<ElemKind::kBF16, InverseKind::kBF16>();
  return inverse_f32 ? launch.template operator()<ElemKind::kF16, InverseKind::kF32>()
                     : launch.template operator()<ElemKind::kF16, InverseKind::kBF16>();
}

}  // namespace

Status launch_chunk_inverse(const kern::ForwardParams& p, kern::ElemKind elem, kern::InverseKind inverse,
                            kern::InverseMerges merges, cudaStream_t stream) {
  kern::ForwardParams grouped = p;
  if (const char* forced = std::getenv("FLASHGDN_INVERSE_HEADS"); forced != nullptr && *forced != '\0') {
    grouped.inverse_heads_per_cta = std::strcmp(forced, "1") == 0   ? 1
                                    : std::strcmp(forced, "2") == 0 ? 2
                                    : std::strcmp(forced, "4") == 0 ? 4
                                                                    : 99;  // over kMaxHeadsPerCta: the launch fails
  }
  return cuda_status(launch_variant(elem, inverse,
                                    [&]<kern::ElemKind E, kern::InverseKind I>() {
                                      return kern::launch_chunk_inverse<E, I>(grouped, merges, stream);
                                    }),
                     "chunk_inverse");
}

Status launch_fused_forward(const kern::ForwardParams& p, kern::ElemKind elem, kern::InverseKind inverse,
                            cudaStream_t stream) {
  return cuda_status(launch_variant(elem, inverse,
                                    [&]<kern::ElemKind E, kern::InverseKind I>() {
                                      return kern::launch_fused_forward<E, I>(p, stream);
                                    }),
                     "fused_forward");
}

}  // namespace flashgdn::detail
