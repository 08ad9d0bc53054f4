// Launchers of the backward's dS pass and gradient pass; instantiated per element type in
// src/kernels/sm90/instantiations/backward_*.cu.
#pragma once

#include <algorithm>

#include "kernels/sm90/backward_ds_pass.cuh"
#include "kernels/sm90/backward_grads.cuh"
#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/launch.h"

namespace flashgdn::kern {

// The dS pass on v4's ring: the CP dS* pass (fwd.cp_pass == kCpStatePass) or, with
// chunk_grad_states, the main mode (kNoCp, kCpMainPass); dO in V's tensor map, the gated inverse
// copy (fwd.gated_inverse_out) in the inverse's, the gate records in fwd.chunk_gates.
template <ElemKind E>
cudaError_t launch_backward_ds_pass(const BackwardParams& p, cudaStream_t stream) {
  const int64_t items = p.fwd.cp_pass == kNoCp ? p.fwd.num_seqs : p.fwd.max_segments;
  if (items == 0 || p.fwd.num_v_heads == 0) return cudaSuccess;
  const bool main_mode = p.fwd.cp_pass != kCpStatePass;
  if (main_mode != (p.chunk_grad_states != nullptr) || p.fwd.gated_inverse_out == nullptr ||
      p.fwd.chunk_gates == nullptr)
    return cudaErrorInvalidValue;
  // the ordered grid's z is the sequence rank: the order is formed for kMaxOrderedSequences at most (params.h)
  if (heads_fastest(p.fwd) && items > kMaxOrderedSequences) return cudaErrorInvalidValue;
  using Pass = BackwardDsPass<ElemType<E>>;
  ForwardParams boxes = p.fwd;
  boxes.v = p.d_o;
  boxes.v_strides = p.d_o_strides;
  boxes.inverse = p.fwd.gated_inverse_out;
  ForwardTileMaps maps;
  if (encode_forward_maps(boxes, E == ElemKind::kF16, &maps) != CUDA_SUCCESS) return cudaErrorInvalidValue;
  // the main mode's dS^T tables by TMA stores of the state groups' 64-row staging panels
  CUtensorMap grad_map{};
  if (main_mode && encode_panel_map(&grad_map, p.chunk_grad_states,
                                    static_cast<uint64_t>(p.fwd.max_chunks) * p.fwd.num_v_heads * 128, 128, 256, 64,
                                    E == ElemKind::kF16) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  constexpr int smem = sizeof(typename Pass::SharedStorage);
  auto* kernel = backward_ds_pass_kernel<ElemType<E>>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); err != cudaSuccess)
    return err;
  // after the previous kernel has completed (grid_dependency.cuh: LaunchOrder::kAfter)
  const dim3 grid = heads_fastest(p.fwd) ? dim3(1, p.fwd.num_v_heads, static_cast<unsigned>(items))  // longest first
                                         : dim3(static_cast<unsigned>(items), p.fwd.num_v_heads);
  return launch_kernel<LaunchOrder::kAfter>(kernel, grid, Pass::kThreads, smem, stream, p, maps, grad_map);
}

// The gradient pass over every (chunk, v-head), one persistent CTA per SM: chunk_states,
// chunk_grad_states (the dS pass's main mode), the fp32 inverse, its gated copy and the gate records
// (and fwd.final_grad_dots, the pre-pass's, where a d_final_state is given).
template <ElemKind E>
cudaError_t launch_backward_grads(const BackwardParams& p, int num_sms, cudaStream_t stream) {
  if (p.fwd.max_chunks == 0 || p.fwd.num_v_heads == 0) return cudaSuccess;
  if (p.chunk_grad_states == nullptr || p.fwd.chunk_states == nullptr ||
      p.fwd.gated_inverse_out == nullptr || p.fwd.chunk_gates == nullptr)
    return cudaErrorInvalidValue;
  using Kernel = BackwardGrads<ElemType<E>>;
  ForwardParams boxes = p.fwd;
  boxes.inverse = p.fwd.gated_inverse_out;
  BackwardTileMaps maps;
  if (encode_backward_maps(boxes, p.d_o, p.d_o_strides, p.chunk_grad_states, p.fwd.max_chunks, E == ElemKind::kF16,
                           &maps) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  // the outputs' maps (tensor_map.h): where one does not encode (an address or stride not a 16-byte
  // multiple), every panel goes out in row pieces
  const auto output_map = [&](CUtensorMap* map, void* base, const RowStrides& strides, int heads) {
    return encode_token_map(map, base, static_cast<uint64_t>(p.fwd.batch), static_cast<uint64_t>(p.fwd.seqlen),
                            static_cast<uint64_t>(heads), 128, strides.batch, strides.token, strides.head,
                            E == ElemKind::kF16) == CUDA_SUCCESS;
  };
  maps.tma_outputs = output_map(&maps.dv, p.dv, p.dv_strides, p.fwd.num_v_heads) &&
                     (!(p.direct_qk || p.group_sums) || (output_map(&maps.dq, p.dq, p.dq_strides, p.fwd.num_qk_heads) &&
                                                         output_map(&maps.dk, p.dk, p.dk_strides, p.fwd.num_qk_heads)));
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = backward_grads_kernel<ElemType<E>>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); err != cudaSuccess)
    return err;
  // persistent: one CTA per SM at most, over items or (group_sums) units of a group's v-heads
  const int64_t items = p.fwd.max_chunks * (p.group_sums ? p.fwd.num_qk_heads : p.fwd.num_v_heads);
  // after the dS pass has completed, not under its tail (grid_dependency.cuh: LaunchOrder::kAfter)
  return launch_kernel<LaunchOrder::kAfter>(kernel, dim3(static_cast<unsigned>(std::min<int64_t>(items, num_sms))),
                                            Kernel::kThreads, smem, stream, p, maps);
}

}  // namespace flashgdn::kern
