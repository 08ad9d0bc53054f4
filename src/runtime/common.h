// Internal: what the forward and backward entry points share: workspace arithmetic, the device
// check, and filling the input side of the kernel parameters (with the launches that prepare it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "flashgdn/flashgdn.h"
#include "kernels/sm90/launch.h"

namespace flashgdn::detail {

inline constexpr std::size_t kWorkspaceAlign = 256;
inline std::size_t align_up(std::size_t x) { return (x + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

Status cuda_status(cudaError_t err, const char* what);

// Upper bound on the chunks of the problem (exact in batch mode and with a host cu_seqlens).
int64_t chunk_bound(const Inputs& in);

// Equal-length packed sequences run as batch mode: a varlen call whose host copy of cu_seqlens shows
// N sequences of one length L > 0 filling the token axis (cu_seqlens[i] = i L, N L = seqlen) is
// batch mode B = N, T = L. Tokens, outputs and every per-sequence row (states, pool slots,
// checkpoints, token states) are numbered alike in both modes, and batch mode needs no device table
// of chunk offsets (item_offsets, a kernel at the head of every varlen call's launch chain).
// uniform_sequence_length: L for such a call, else 0 (also without a host copy).
int64_t uniform_sequence_length(const Inputs& in);
// t, a (1, N L, ...) tensor, viewed as (N, L, ...): the token axis split into N entries.
TensorRef split_token_axis(const TensorRef& t, int64_t batch, int64_t length);
// in as batch mode (q, k, v, g, beta split; varlen dropped) for length = uniform_sequence_length(in) > 0.
Inputs as_batch(const Inputs& in, int64_t length);

// Varlen mode: whether tokens past cu_seqlens[N] may exist (their outputs are zeroed by a padding
// kernel); false only when the host copy of cu_seqlens shows the sequences fill every token.
bool may_have_padding(const Inputs& in);

// kNotBuilt unless the current device is sm_90.
Status check_device();

// The current device's SM count (132, the H200's, when it cannot be queried).
int32_t num_sms();

// The corrections' slice width (plan::correction_slice_cols on this device), unless the environment
// variable FLASHGDN_CP_SLICE_COLS is set (read at every call: the tests and A/B runs force 16 or 32;
// any other value gives 0, which fails the correction's launch with an invalid-argument error).
int32_t cp_slice_cols(int64_t num_sequences, int32_t num_v_heads);

// kWorkspaceTooSmall / kInvalidArgument for a workspace that cannot hold `needed` bytes.
Status check_workspace(const void* workspace, std::size_t bytes, std::size_t needed);

// The forward's inverse cache for its backward (ForwardProblem::inverse_cache): what the chunk inverse
// writes in the backward's format (or v5's kKeepsInverse kernel, fused_forward_inv.cuh, in the same
// format), for inputs in their batch view. Offsets from the cache's start.
struct InverseCacheLayout {
  std::size_t inverse = 0;        // A_r's rows, fp16 [B*T, Hv, 64] (the fp16 merges' values, exact; zeros above
                                  // the diagonal)
  std::size_t gated_inverse = 0;  // Ag [B*T, Hv, 64] in q's dtype
  std::size_t chunk_gates = 0;    // the gate records, fp32 [chunk bound, Hv, 128]
  std::size_t window_terms = 0;   // the decay-window terms, fp32 [chunk bound, Hv]
  std::size_t bytes = 0;
};
InverseCacheLayout inverse_cache_layout(const Inputs& in);
// kInvalidArgument unless the cache (present) holds exactly layout.bytes.
Status check_inverse_cache_size(const TensorRef& cache, const InverseCacheLayout& layout);
// The chunk inverse's outputs in the backward's format (A_r's fp16 rows into p.inverse, Ag into
// p.gated_inverse_out, the gate records, the window terms), pointed into the cache.
void bind_inverse_cache(kern::ForwardParams& p, const TensorRef& cache, const InverseCacheLayout& layout);

kern::RowStrides row_strides(const TensorRef& t);
kern::ElemKind elem_kind(const Inputs& in);

// Workspace regions every launch sequence has; offsets from the start of the workspace.
struct InputLayout {
  bool chunk_table = false;       // varlen calls whose kernels need the chunk table (all but decode)
  std::size_t chunk_offsets = 0;  // int32 [N + 1], with chunk_table only
  bool order_table = false;        // with chunk_table and N <= kern::kMaxOrderedSequences
  std::size_t sequence_order = 0;  // int32 [N], with order_table only (ForwardParams::sequence_order)
  std::size_t q_normalized = 0;   // [B, T, Hqk, 128], with use_qk_l2norm_in_kernel only
  std::size_t k_normalized = 0;
  std::size_t end = 0;            // first byte after them
};
// chunk_table: whether the call's kernels locate chunks (false for the recurrent decode, which reads
// cu_seqlens directly): a varlen call builds the table only then.
InputLayout input_layout(const Inputs& in, bool chunk_table = true);

// Whether the call's per-item kernels (v4, v5, the dS pass) take the sequences longest first
// (ForwardParams::sequence_order): varlen without CP (`cp`: the call runs intra-card CP, whose segments
// are balanced by its cut) with the order table, more items (N Hv) than SMs (within one wave the order
// changes nothing) and some chunk (chunk_bound), into longest_first, unless the environment variable
// FLASHGDN_SEQUENCE_ORDER is "natural" (read at every call: the tests' and A/B runs' switch; the
// results are bitwise the same either way, the workspace too). Its values: unset or empty, or "longest"
// (the default: the order where the call qualifies), and "natural"; any other value is kInvalidArgument
// on every call that reads it (the forward and the backward), whether or not the call would order, so
// that a misspelt switch fails instead of measuring the default twice.
Status orders_sequences(const Inputs& in, const InputLayout& layout, bool cp, bool& longest_first);

// The input side of p: q, k (L2-normalised into the workspace when asked, launching l2norm_rows),
// v, g, beta, initial_state, problem sizes, varlen tables (with layout.chunk_table, launching chunk_offsets; with
// segment_offsets, a varlen CP call's segment table of segment_chunks-chunk segments in the same
// launch: bind_cp then only binds it; with longest_first, orders_sequences' answer, the sequence order
// in the same launch too, bound to p.sequence_order).
Status prepare_inputs(const Inputs& in, const InputLayout& layout, unsigned char* workspace, cudaStream_t stream,
                      kern::ForwardParams& p, int32_t* segment_offsets, int64_t segment_chunks, bool longest_first);

}  // namespace flashgdn::detail

namespace flashgdn::detail {

// The (elem, inverse storage) variant of chunk_inverse / fused_forward. The chunk inverse's v-heads
// a CTA are the launcher's choice (ChunkInverse::heads_per_cta) unless the environment variable
// FLASHGDN_INVERSE_HEADS forces 1, 2 or 4 (read at every call, for measurements; any other value
// fails the launch with an invalid-argument error); its merges (kern::InverseMerges) split only for
// the fp32 inverse.
Status launch_chunk_inverse(const kern::ForwardParams& p, kern::ElemKind elem, kern::InverseKind inverse,
                            kern::InverseMerges merges, cudaStream_t stream);
Status launch_fused_forward(const kern::ForwardParams& p, kern::ElemKind elem, kern::InverseKind inverse,
                            cudaStream_t stream);

}  // namespace flashgdn::detail
