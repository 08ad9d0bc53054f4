// The C ABI (src/capi/flashgdn_c.h): converts the flat structs to the C++ problem types.
#include "capi/flashgdn_c.h"

#include <cstring>

#include "flashgdn/flashgdn.h"
#include "flashgdn/reference.h"
#ifdef FLASHGDN_WITH_KERNELS
#include "runtime/forward.h"
#endif

namespace {

using namespace flashgdn;

TensorRef to_ref(const flashgdn_tensor& t) {
  TensorRef r;
  r.data = t.data;
  r.dtype = static_cast<DType>(t.dtype);
  r.rank = t.rank;
  for (int i = 0; i < 4; ++i) {
    r.sizes[i] = t.sizes[i];
    r.strides[i] = t.strides[i];
  }
  return r;
}

Inputs to_inputs(const flashgdn_inputs& c) {
  Inputs in;
  in.shape = {c.batch, c.seqlen, c.num_qk_heads, c.num_v_heads, c.head_dim_k, c.head_dim_v};
  in.varlen.cu_seqlens = c.cu_seqlens;
  in.varlen.dtype = static_cast<DType>(c.cu_seqlens_dtype);
  in.varlen.num_seqs = c.num_seqs;
  in.varlen.cu_seqlens_host = c.cu_seqlens_host;
  in.q = to_ref(c.q);
  in.k = to_ref(c.k);
  in.v = to_ref(c.v);
  in.g = to_ref(c.g);
  in.beta = to_ref(c.beta);
  in.initial_state = to_ref(c.initial_state);
  in.initial_state_indices = to_ref(c.initial_state_indices);
  in.state_layout = c.state_v_first ? StateLayout::kVK : StateLayout::kKV;
  if (c.has_scale) in.scale = c.scale;
  in.use_qk_l2norm_in_kernel = c.use_qk_l2norm_in_kernel != 0;
  in.context_parallelism.mode = c.context_parallel == 1   ? ContextParallel::kOff
                                : c.context_parallel == 2 ? ContextParallel::kOn
                                                          : ContextParallel::kAuto;
  in.context_parallelism.segment_chunks = c.cp_segment_chunks;
  if (c.cp_decay_threshold != 0.f) in.context_parallelism.decay_threshold = c.cp_decay_threshold;
  return in;
}

ForwardProblem to_forward(const flashgdn_inputs* in, const flashgdn_forward_outputs* out) {
  ForwardProblem p;
  p.in = to_inputs(*in);
  p.o = to_ref(out->o);
  p.final_state = to_ref(out->final_state);
  p.final_state_indices = to_ref(out->final_state_indices);
  p.checkpoints = to_ref(out->checkpoints);
  p.checkpoint_chunks = out->checkpoint_chunks;
  p.token_states = to_ref(out->token_states);
  p.shard_phase = static_cast<ShardPhase>(out->shard_phase);
  p.shard_maps = to_ref(out->shard_maps);
  p.cp_states = to_ref(out->cp_states);
  p.cp_transitions = to_ref(out->cp_transitions);
  p.inverse_cache = to_ref(out->inverse_cache);
  return p;
}

BackwardProblem to_backward(const flashgdn_inputs* in, const flashgdn_backward_tensors* g) {
  BackwardProblem p;
  p.in = to_inputs(*in);
  p.d_o = to_ref(g->d_o);
  p.d_final_state = to_ref(g->d_final_state);
  p.dq = to_ref(g->dq);
  p.dk = to_ref(g->dk);
  p.dv = to_ref(g->dv);
  p.dg = to_ref(g->dg);
  p.dbeta = to_ref(g->dbeta);
  p.d_initial_state = to_ref(g->d_initial_state);
  p.shard_phase = static_cast<ShardPhase>(g->shard_phase);
  p.shard_grad = to_ref(g->shard_grad);
  p.inverse_fp32 = g->inverse_fp32 != 0;
  p.cp_states = to_ref(g->cp_states);
  p.cp_transitions = to_ref(g->cp_transitions);
  p.cp_segment_chunks = g->cp_segment_chunks;
  p.inverse_cache = to_ref(g->inverse_cache);
  return p;
}

int report(const Status& s, char* msg, int msg_len) {
  if (msg != nullptr && msg_len > 0) {
    const std::size_t n = std::min<std::size_t>(s.message().size(), static_cast<std::size_t>(msg_len - 1));
    std::memcpy(msg, s.message().data(), n);
    msg[n] = '\0';
  }
  return static_cast<int>(s.code());
}

Status null_argument(const char* what) { return {StatusCode::kInvalidArgument, std::string(what) + ": null pointer"}; }

}  // namespace

extern "C" {

const char* flashgdn_version(void) { return flashgdn::version(); }

int flashgdn_struct_sizes(size_t* sizes, int count) {
  const size_t known[] = {sizeof(flashgdn_tensor), sizeof(flashgdn_inputs), sizeof(flashgdn_forward_outputs),
                          sizeof(flashgdn_backward_tensors)};
  for (int i = 0; i < count && i < 4; ++i) sizes[i] = known[i];
  return 4;
}

int flashgdn_has_kernels(void) {
#ifdef FLASHGDN_WITH_KERNELS
  return 1;
#else
  return 0;
#endif
}

int flashgdn_set_timeline(void* device_buffer, char* msg, int msg_len) {
#ifdef FLASHGDN_WITH_KERNELS
  return report(detail::set_timeline(device_buffer), msg, msg_len);
#else
  (void)device_buffer;
  return report({StatusCode::kNotBuilt, "timeline: flashgdn was built without CUDA kernels"}, msg, msg_len);
#endif
}

int flashgdn_forward_workspace_size(const flashgdn_inputs* in, const flashgdn_forward_outputs* out,
                                    int variant, size_t* bytes, char* msg, int msg_len) {
  if (in == nullptr || out == nullptr) return report(null_argument("problem"), msg, msg_len);
  const ForwardProblem p = to_forward(in, out);
  Status s = forward_workspace_size(p, bytes);
#ifdef FLASHGDN_WITH_KERNELS
  if (s.ok() && (variant & 1))
    *bytes = detail::forward_layout(p, kern::InverseKind::kF32).bytes;
#else
  (void)variant;
#endif
  return report(s, msg, msg_len);
}

int flashgdn_forward_cp_cache_shape(const flashgdn_inputs* in, const flashgdn_forward_outputs* out,
                                    int64_t* segment_chunks, int64_t* segments, char* msg, int msg_len) {
  if (in == nullptr || out == nullptr) return report(null_argument("problem"), msg, msg_len);
  if (segment_chunks == nullptr || segments == nullptr) return report(null_argument("segment_chunks, segments"), msg, msg_len);
  CpCacheShape shape;
  const Status s = forward_cp_cache_shape(to_forward(in, out), &shape);
  *segment_chunks = shape.segment_chunks;
  *segments = shape.segments;
  return report(s, msg, msg_len);
}

int flashgdn_forward_inverse_cache_bytes(const flashgdn_inputs* in, const flashgdn_forward_outputs* out,
                                         size_t* bytes, char* msg, int msg_len) {
  if (in == nullptr || out == nullptr) return report(null_argument("problem"), msg, msg_len);
  if (bytes == nullptr) return report(null_argument("bytes"), msg, msg_len);
  return report(forward_inverse_cache_bytes(to_forward(in, out), bytes), msg, msg_len);
}

int flashgdn_forward(const flashgdn_inputs* in, const flashgdn_forward_outputs* out, int variant,
                     void* workspace, size_t workspace_bytes, void* stream, char* msg, int msg_len) {
  if (in == nullptr || out == nullptr) return report(null_argument("problem"), msg, msg_len);
  const ForwardProblem p = to_forward(in, out);
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
#ifdef FLASHGDN_WITH_KERNELS
  detail::ForwardVariant v;
  v.inverse = (variant & 1) ? kern::InverseKind::kF32 : detail::kDefaultInverse;
  v.v_split = (variant >> 1) & 3;
  v.kernel = static_cast<detail::FusedKernel>((variant >> 3) & 7);
  return report(detail::forward_with(p, v, workspace, workspace_bytes, cuda_stream), msg, msg_len);
#else
  (void)variant;
  return report(forward(p, workspace, workspace_bytes, cuda_stream), msg, msg_len);
#endif
}

int flashgdn_backward_workspace_size(const flashgdn_inputs* in, const flashgdn_backward_tensors* grads,
                                     size_t* bytes, char* msg, int msg_len) {
  if (in == nullptr || grads == nullptr) return report(null_argument("problem"), msg, msg_len);
  return report(backward_workspace_size(to_backward(in, grads), bytes), msg, msg_len);
}

int flashgdn_backward(const flashgdn_inputs* in, const flashgdn_backward_tensors* grads, void* workspace,
                      size_t workspace_bytes, void* stream, char* msg, int msg_len) {
  if (in == nullptr || grads == nullptr) return report(null_argument("problem"), msg, msg_len);
  return report(backward(to_backward(in, grads), workspace, workspace_bytes, static_cast<cudaStream_t>(stream)),
                msg, msg_len);
}

int flashgdn_reference_forward(const flashgdn_inputs* in, const flashgdn_forward_outputs* out, char* msg,
                               int msg_len) {
  if (in == nullptr || out == nullptr) return report(null_argument("problem"), msg, msg_len);
  return report(reference::forward(to_forward(in, out)), msg, msg_len);
}

int flashgdn_reference_backward(const flashgdn_inputs* in, const flashgdn_backward_tensors* grads, char* msg,
                                int msg_len) {
  if (in == nullptr || grads == nullptr) return report(null_argument("problem"), msg, msg_len);
  return report(reference::backward(to_backward(in, grads)), msg, msg_len);
}

}  // extern "C"
