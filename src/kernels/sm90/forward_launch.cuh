// Launchers of the chunk-inverse and fused-forward kernels; instantiated per (elem, inverse) in
// src/kernels/sm90/instantiations/.
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/sm90/chunk_inverse.cuh"
#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/fused_forward.cuh"
#include "kernels/sm90/fused_forward_inv.cuh"
#include "kernels/sm90/fused_forward_rs.cuh"
#include "kernels/sm90/fused_forward_wg.cuh"
#include "kernels/sm90/fused_forward_ws.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/tensor_map.h"

namespace flashgdn::kern {

// InverseT: ChunkInverse's rows (float, __nv_bfloat16, or __half beside Ag).
template <ElemKind E, typename InverseT, bool kSplitMerges, int kCtasPerSm>
cudaError_t launch_chunk_inverse_grid(const ForwardParams& grouped, cudaStream_t stream) {
  using Kernel = ChunkInverse<ElemType<E>, InverseT, kSplitMerges>;
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  auto* kernel = chunk_inverse_kernel<ElemType<E>, InverseT, kSplitMerges, kCtasPerSm>;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  // All of the unified L1 as shared memory: as many CTAs per SM as fit.
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared);
      err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>(grouped.max_chunks), Kernel::groups_per_qk_head(grouped),
                  grouped.num_qk_heads);
  return launch_kernel(kernel, grid, Kernel::kThreads, smem, stream, grouped);
}

// The v-heads a CTA (p.inverse_heads_per_cta, or the launcher's choice), then the kernel built for as
// many CTAs a SM as suit them (chunk_inverse_ctas_per_sm).
template <ElemKind E, typename InverseT, bool kSplitMerges>
cudaError_t launch_chunk_inverse_kernel(const ForwardParams& p, cudaStream_t stream) {
  using Kernel = ChunkInverse<ElemType<E>, InverseT, kSplitMerges>;
  int device = 0, sms = 0;
  if (auto err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (auto err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess) return err;
  ForwardParams grouped = p;
  if (p.inverse_heads_per_cta <= 0) grouped.inverse_heads_per_cta = Kernel::heads_per_cta(p, 2 * static_cast<int64_t>(sms));
  else if (p.inverse_heads_per_cta > Kernel::kMaxHeadsPerCta)
    return cudaErrorInvalidValue;
  constexpr int one_head = chunk_inverse_ctas_per_sm<InverseT>(1);
  constexpr int more_heads = chunk_inverse_ctas_per_sm<InverseT>(2);
  const int heads = std::min(grouped.inverse_heads_per_cta, p.num_v_heads / p.num_qk_heads);  // a CTA's, at most
  if (heads == 1) return launch_chunk_inverse_grid<E, InverseT, kSplitMerges, one_head>(grouped, stream);
  return launch_chunk_inverse_grid<E, InverseT, kSplitMerges, more_heads>(grouped, stream);
}

// Split merges only for the fp32 inverse (a 16-bit inverse gains nothing from them), written in fp32.
// The 16-bit inverse with p.inverse_rows_fp16 (the forward keeping the inverse cache): the fp32
// inverse's fp16 rows and Ag (p.gated_inverse_out, required), the same bytes, by its __half build.
template <ElemKind E, InverseKind I>
cudaError_t launch_chunk_inverse(const ForwardParams& p, InverseMerges merges, cudaStream_t stream) {
  if (p.max_chunks == 0 || p.num_v_heads == 0) return cudaSuccess;
  if constexpr (I == InverseKind::kF32) {
    if (merges == InverseMerges::kSplit) {  // its X is not fp16-exact: fp32 rows only
      if (p.inverse_rows_fp16) return cudaErrorInvalidValue;
      return launch_chunk_inverse_kernel<E, float, true>(p, stream);
    }
  } else {
    if (merges == InverseMerges::kSplit || p.inverse_rows_fp16 != (p.gated_inverse_out != nullptr))
      return cudaErrorInvalidValue;
    if (p.inverse_rows_fp16) return launch_chunk_inverse_kernel<E, __half, false>(p, stream);
  }
  return launch_chunk_inverse_kernel<E, InverseType<I>, false>(p, stream);
}

// One CTA of Kernel per (sequence or segment, v-head x ctas_per_head[, S* / M in the CP state pass]);
// `extra`: the kernel's parameters after p.
template <typename Kernel, typename... Extra>
cudaError_t launch_per_item(void (*kernel)(ForwardParams, Extra...), const ForwardParams& p, int64_t items,
                            int ctas_per_head, cudaStream_t stream, const Extra&... extra) {
  constexpr int smem = sizeof(typename Kernel::SharedStorage);
  // the ordered grid's z is the sequence rank: the order is formed for kMaxOrderedSequences at most (params.h)
  if (heads_fastest(p) && items > kMaxOrderedSequences) return cudaErrorInvalidValue;
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  const dim3 grid = heads_fastest(p) ? dim3(1, p.num_v_heads, static_cast<unsigned>(items))  // v4, v5 longest first
                                     : dim3(static_cast<unsigned>(items), p.num_v_heads * ctas_per_head,
                                            p.cp_pass == kCpStatePass ? 2 : 1);
  return launch_kernel(kernel, grid, Kernel::kThreads, smem, stream, p, extra...);
}

template <ElemKind E, InverseKind I>
cudaError_t launch_fused_forward(const ForwardParams& p, cudaStream_t stream) {
  const int64_t items = p.cp_pass == kNoCp ? p.num_seqs : p.max_segments;
  if (items == 0 || p.num_v_heads == 0) return cudaSuccess;
  using Elem = ElemType<E>;
  using InverseT = InverseType<I>;
  if (p.inverse_inside) {  // bf16 Ag only (runtime/forward.cpp refuses the fp32 inverse)
    if constexpr (std::is_same_v<InverseT, float>)
      return cudaErrorInvalidValue;
    else {
      ForwardTileMaps maps;  // q, k, v (its inverse map is unused)
      if (p.chunk_gates == nullptr || encode_forward_maps(p, E == ElemKind::kF16, &maps) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
      // The forward keeping the inverse cache (p.gated_inverse_out, with the fp16 rows and the window
      // terms beside it): its own kernel, without CP only (each chunk in one main-pass item).
      if (p.gated_inverse_out != nullptr) {
        if (p.cp_pass != kNoCp || !p.inverse_rows_fp16 || p.inverse == nullptr || p.chunk_window_terms == nullptr)
          return cudaErrorInvalidValue;
        return launch_per_item<FusedForwardInv<Elem, true>>(fused_forward_inv_kernel<Elem, true>, p, items, 1, stream,
                                                             maps);
      }
      return launch_per_item<FusedForwardInv<Elem>>(fused_forward_inv_kernel<Elem, false>, p, items, 1, stream, maps);
    }
  }
  if (p.register_state) {  // bf16 inverse only (runtime/forward.cpp refuses the fp32 one)
    if constexpr (std::is_same_v<InverseT, float>)
      return cudaErrorInvalidValue;
    else {
      ForwardTileMaps maps;  // the TMA descriptors of q, k, v, the gated inverse and chunk_states
      if (!p.gated_inverse || p.chunk_gates == nullptr ||
          encode_forward_maps(p, E == ElemKind::kF16, &maps) != CUDA_SUCCESS ||
          (p.chunk_states != nullptr && encode_states_map(p, E == ElemKind::kF16, &maps) != CUDA_SUCCESS))
        return cudaErrorInvalidValue;
      if (p.exact_state_update) {  // the backward's pre-pass: never o
        if (p.o != nullptr) return cudaErrorInvalidValue;
        return launch_per_item<FusedForwardRs<Elem, InverseT>>(fused_forward_rs_kernel<Elem, InverseT, true>, p, items,
                                                               1, stream, maps);
      }
      return launch_per_item<FusedForwardRs<Elem, InverseT>>(fused_forward_rs_kernel<Elem, InverseT, false>, p, items,
                                                             1, stream, maps);
    }
  }
  ForwardParams natural = p;  // v1-v3 take their items in the natural order (CTA (x, h): sequence x)
  natural.sequence_order = nullptr;
  if (p.warp_specialized)
    return launch_per_item<FusedForwardWs<Elem, InverseT>>(fused_forward_ws_kernel<Elem, InverseT>, natural, items, 1,
                                                           stream);
  if (p.wgmma)
    return launch_per_item<FusedForwardWg<Elem, InverseT>>(fused_forward_wg_kernel<Elem, InverseT>, natural, items, 1,
                                                           stream);
  if (p.v_split == 2)
    return launch_per_item<FusedForward<Elem, InverseT, 2>>(fused_forward_kernel<Elem, InverseT, 2>, natural, items, 2,
                                                            stream);
  return launch_per_item<FusedForward<Elem, InverseT, 1>>(fused_forward_kernel<Elem, InverseT, 1>, natural, items, 1,
                                                          stream);
}

}  // namespace flashgdn::kern
