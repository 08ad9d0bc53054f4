// Launcher of the fused backward kernel; instantiated per element type in
// src/kernels/sm90/instantiations/backward_*.cu.
#pragma once

#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/fused_backward.cuh"
#include "kernels/sm90/launch.h"

namespace flashgdn::kern {

template <ElemKind E>
cudaError_t launch_fused_backward(const BackwardParams& p, cudaStream_t stream) {
  using Kernel = FusedBackward<ElemType<E>>;
  if (p.fwd.num_seqs == 0 || p.fwd.num_v_heads == 0) return cudaSuccess;
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = fused_backward_kernel<ElemType<E>>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  kernel<<<dim3(static_cast<unsigned>(p.fwd.num_seqs), p.fwd.num_v_heads), Kernel::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashgdn::kern
