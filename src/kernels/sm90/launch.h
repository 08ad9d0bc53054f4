// Host-side launchers of the SM90 forward kernels (defined in the .cu files). Plain C++ header.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/sm90/params.h"

namespace flashgdn::kern {

enum class ElemKind { kBF16, kF16 };   // dtype of q, k, v, o
enum class InverseKind { kF32, kBF16 };  // storage of the gate-free inverse A_r
// The chunk inverse's merges (chunk_inverse.cuh): plain fp16 (needs beta |k|^2 <= 2: the bf16 inverse
// always, the backward's fp32 one by default) or split bf16, bf16x3 (any keys; fp32 storage only).
enum class InverseMerges { kHalf, kSplit };

// x / sqrt(sum(x^2) + 1e-6) of each 128-vector of src into the contiguous dst (rows = b*t*h).
template <ElemKind E>
cudaError_t launch_l2norm_rows(const void* src, int64_t batch, int64_t tokens, int64_t heads,
                               int64_t stride_batch, int64_t stride_token, int64_t stride_head,
                               void* dst, cudaStream_t stream);

// chunk_offsets[i] = sum_{j < i} ceil(len_j / 64) for i in 0..num_seqs (varlen only) and, with
// segment_offsets (varlen CP), segment_offsets[i] = sum_{j < i} ceil(ceil(len_j / 64) / segment_chunks)
// in the same launch; with sequence_order (num_seqs <= kMaxOrderedSequences), also the sequences longest
// first there (ForwardParams::sequence_order).
cudaError_t launch_chunk_offsets(const ForwardParams& p, int32_t* segment_offsets, int64_t segment_chunks,
                                 int32_t* sequence_order, cudaStream_t stream);

// Token-by-token forward of short sequences (decoding, speculative verification): o and the final
// states, no chunk inverse needed.
template <ElemKind E>
cudaError_t launch_recurrent_decode(const ForwardParams& p, cudaStream_t stream);

// checkpoint_offsets[i] = sum_{j < i} floor(len_j / (64 checkpoint_chunks)) (varlen checkpoints).
cudaError_t launch_checkpoint_offsets(const ForwardParams& p, cudaStream_t stream);

// CP: decay window of every (segment, v-head) into windows: trailing chunks (forward) or leading
// chunks (backward) whose summed log map-norm bound reaches decay_threshold; 0 without one.
template <ElemKind E>
cudaError_t launch_cp_windows(const ForwardParams& p, int32_t* windows, bool leading, cudaStream_t stream);

// CP: S_{j+1} = S*_j (+ M_j S_j without a window) per (sequence, v-head) into segment_starts;
// slice_cols 16 or 32 state columns a CTA (plan::correction_slice_cols; else cudaErrorInvalidValue).
cudaError_t launch_cp_correction(const ForwardParams& p, int slice_cols, cudaStream_t stream);

// Shard maps (p.shard, after the state pass): per (sequence, v-head) the end state from zero,
// E = S_J of the correction chain from S_0 = 0, and the product M = M_{J-1} ... M_0 (zero when a
// segment has a window) into p.shard_maps.
cudaError_t launch_cp_shard_maps(const ForwardParams& p, cudaStream_t stream);

// Inter-GPU CP over NCCL: S_rank into entering and S_world into final_state (ShardScanParams).
cudaError_t launch_shard_scan(const ShardScanParams& params, cudaStream_t stream);
// ... and in reverse: the gradient leaving this rank's slice into d_out (ShardGradScanParams).
cudaError_t launch_shard_grad_scan(const ShardGradScanParams& params, cudaStream_t stream);
// states[n][h] (fp32, user layout) = src[n][h] (fp32 [N][hv][128][128], K-major), or zeros when
// src is null, for N sequences and num_v_heads heads.
cudaError_t launch_state_store(const float* src, float* states, const int64_t (&strides)[4], bool vk,
                               int64_t num_seqs, int num_v_heads, cudaStream_t stream);

// Backward shard map (fwd.shard, after the dS* pass): per (sequence, v-head) D = dS_0 of the reverse
// chain dS_J = 0, dS_j = dS*_j + [no window] M_j^T dS_{j+1}, into bp.shard_grad.
cudaError_t launch_cp_grad_shard_maps(const BackwardParams& bp, cudaStream_t stream);

// Backward CP: dS_j = dS*_j (+ M_j^T dS_{j+1} without a window), j = J-1 .. 1, per (sequence,
// v-head) into segment_grad_ends[j - 1]; slice_cols as launch_cp_correction's.
cudaError_t launch_cp_grad_correction(const BackwardParams& p, int slice_cols, cudaStream_t stream);

// The gate record of every (chunk, v-head) into p.chunk_gates (chunk_gates.cuh), for the forward
// that forms A_r itself (p.inverse_inside) in place of the chunk inverse.
cudaError_t launch_chunk_gates(const ForwardParams& p, cudaStream_t stream);

// o rows of tokens past cu_seqlens[num_seqs] set to zero (varlen only).
cudaError_t launch_zero_padding(const ForwardParams& p, ElemKind elem, cudaStream_t stream);

template <ElemKind E, InverseKind I>
cudaError_t launch_chunk_inverse(const ForwardParams& p, InverseMerges merges, cudaStream_t stream);

template <ElemKind E, InverseKind I>
cudaError_t launch_fused_forward(const ForwardParams& p, cudaStream_t stream);

// Backward (the inverse in fp32, its gated copy, the gate records and chunk_states written by the
// forward passes first). The dS pass on v4's ring (backward_ds_pass.cuh; needs fwd.gated_inverse_out
// and fwd.chunk_gates): the CP dS* pass, or with chunk_grad_states the main mode.
template <ElemKind E>
cudaError_t launch_backward_ds_pass(const BackwardParams& p, cudaStream_t stream);
// The gradient pass (backward_grads.cuh) over every (chunk, v-head), after the main mode.
template <ElemKind E>
cudaError_t launch_backward_grads(const BackwardParams& p, int num_sms, cudaStream_t stream);

// dq, dk from the per-v-head fp32 gradients: group sum, L2-norm backward, cast, varlen padding.
template <ElemKind E>
cudaError_t launch_qk_grads(const BackwardParams& p, cudaStream_t stream);

// dv, dg, dbeta of tokens past cu_seqlens[num_seqs] set to zero (varlen only).
cudaError_t launch_zero_grad_padding(const BackwardParams& p, ElemKind elem, cudaStream_t stream);

}  // namespace flashgdn::kern
