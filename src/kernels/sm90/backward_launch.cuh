// Launcher of the fused backward kernel; instantiated per element type in
// src/kernels/sm90/instantiations/backward_*.cu.
#pragma once

#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/fused_backward.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/launch.h"

namespace flashgdn::kern {

template <ElemKind E>
cudaError_t launch_fused_backward(const BackwardParams& p, cudaStream_t stream) {
  const int64_t items = p.fwd.cp_pass == kNoCp ? p.fwd.num_seqs : p.fwd.max_segments;
  if (items == 0 || p.fwd.num_v_heads == 0) return cudaSuccess;
  const bool state_grad_only = p.fwd.cp_pass == kCpStatePass;
  using Full = FusedBackward<ElemType<E>, false>;
  constexpr int smem = sizeof(typename Full::SharedStorage);
  auto* kernel = state_grad_only ? fused_backward_kernel<ElemType<E>, true> : fused_backward_kernel<ElemType<E>, false>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(items), p.fwd.num_v_heads), Full::kThreads, smem, stream, p);
}

}  // namespace flashgdn::kern
