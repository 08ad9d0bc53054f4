// Launchers of the chunk-inverse and fused-forward kernels; instantiated per (elem, inverse) in
// src/kernels/sm90/instantiations/.
#pragma once

#include "kernels/sm90/chunk_inverse.cuh"
#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/fused_forward.cuh"
#include "kernels/sm90/fused_forward_wg.cuh"
#include "kernels/sm90/fused_forward_ws.cuh"
#include "kernels/sm90/launch.h"

namespace flashgdn::kern {

template <ElemKind E, InverseKind I>
cudaError_t launch_chunk_inverse(const ForwardParams& p, cudaStream_t stream) {
  using Kernel = ChunkInverse<ElemType<E>, InverseType<I>>;
  if (p.max_chunks == 0 || p.num_v_heads == 0) return cudaSuccess;
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = chunk_inverse_kernel<ElemType<E>, InverseType<I>>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  // All of the unified L1 as shared memory: as many CTAs per SM as fit.
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared);
      err != cudaSuccess)
    return err;
  kernel<<<dim3(static_cast<unsigned>(p.max_chunks), p.num_v_heads), Kernel::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename Elem, typename InverseT, int kVSplit>
cudaError_t launch_fused_forward_split(const ForwardParams& p, int64_t items, cudaStream_t stream) {
  using Kernel = FusedForward<Elem, InverseT, kVSplit>;
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = fused_forward_kernel<Elem, InverseT, kVSplit>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>(items), p.num_v_heads * kVSplit, p.cp_pass == kCpStatePass ? 2 : 1);
  kernel<<<grid, Kernel::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename Elem, typename InverseT>
cudaError_t launch_fused_forward_wg(const ForwardParams& p, int64_t items, cudaStream_t stream) {
  using Kernel = FusedForwardWg<Elem, InverseT>;
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = fused_forward_wg_kernel<Elem, InverseT>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>(items), p.num_v_heads, p.cp_pass == kCpStatePass ? 2 : 1);
  kernel<<<grid, Kernel::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename Elem, typename InverseT>
cudaError_t launch_fused_forward_ws(const ForwardParams& p, int64_t items, cudaStream_t stream) {
  using Kernel = FusedForwardWs<Elem, InverseT>;
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = fused_forward_ws_kernel<Elem, InverseT>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>(items), p.num_v_heads, p.cp_pass == kCpStatePass ? 2 : 1);
  kernel<<<grid, Kernel::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <ElemKind E, InverseKind I>
cudaError_t launch_fused_forward(const ForwardParams& p, cudaStream_t stream) {
  const int64_t items = p.cp_pass == kNoCp ? p.num_seqs : p.max_segments;
  if (items == 0 || p.num_v_heads == 0) return cudaSuccess;
  if (p.warp_specialized) return launch_fused_forward_ws<ElemType<E>, InverseType<I>>(p, items, stream);
  if (p.wgmma) return launch_fused_forward_wg<ElemType<E>, InverseType<I>>(p, items, stream);
  return p.v_split == 2 ? launch_fused_forward_split<ElemType<E>, InverseType<I>, 2>(p, items, stream)
                        : launch_fused_forward_split<ElemType<E>, InverseType<I>, 1>(p, items, stream);
}

}  // namespace flashgdn::kern
