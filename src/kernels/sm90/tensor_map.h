// Host side of the TMA loads (tma.cuh): tensor maps over bf16/fp16 elements whose boxes land in
// shared memory in the 128-byte-swizzled panel layout of wgmma.cuh. Plain C++.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sm90/params.h"

namespace flashgdn::kern {

// cuTensorMapEncodeTiled through the runtime's entry-point query, so that nothing links libcuda (a
// build without a driver still loads); null when the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encoder = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault,
                                                     &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry) : nullptr;
  }();
  return encoder;
}

// Tensor [rows][cols] of 2-byte elements, `row_stride_bytes` apart (a multiple of 16); boxes of
// box_rows x 64 elements (one swizzled panel). Returns the driver's status (CUDA_ERROR_NOT_FOUND
// when the entry point is missing).
inline CUresult encode_panel_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                                 uint64_t row_stride_bytes, uint32_t box_rows, bool f16) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Workspace of `blocks` contiguous [128][128] fp32 blocks as a [blocks x 128 rows][128] tensor; boxes
// of 128 rows x box_cols columns (box_cols x 4 <= 128 bytes: one 128-byte-swizzled panel).
inline CUresult encode_block_map(CUtensorMap* map, const float* base, uint64_t blocks, uint32_t box_cols) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[2] = {128, blocks * 128};
  const cuuint64_t strides[1] = {128 * 4};
  const cuuint32_t box[2] = {box_cols, 128};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Tensor (batch, tokens, heads, cols) of 2-byte elements, unit stride on cols, the other strides in
// elements (multiples of 8 where the extent exceeds 1); boxes of 64 tokens x 64 columns of one
// head and batch row, each one swizzled panel [64 tokens][64] (tma::load_4d at (col, head, token,
// batch)). Tokens past the tensor's end arrive as zeros.
inline CUresult encode_token_map(CUtensorMap* map, const void* base, uint64_t batch, uint64_t tokens, uint64_t heads,
                                 uint64_t cols, int64_t batch_stride, int64_t token_stride, int64_t head_stride,
                                 bool f16) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  // A dimension of extent 1 is never stepped: any valid stride (non-zero, 16-byte multiple) stands in.
  const auto bytes = [](int64_t stride, uint64_t extent, uint64_t fallback) {
    return extent > 1 ? static_cast<cuuint64_t>(stride) * 2 : static_cast<cuuint64_t>(fallback);
  };
  const cuuint64_t head_bytes = bytes(head_stride, heads, cols * 2);
  const cuuint64_t token_bytes = bytes(token_stride, tokens, head_bytes * heads);
  const cuuint64_t strides[3] = {head_bytes, token_bytes, bytes(batch_stride, batch, token_bytes * tokens)};
  const cuuint64_t dims[4] = {cols, heads, tokens, batch};
  const cuuint32_t box[4] = {64, 1, 64, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The token tiles of the TMA-fed fused forward (fused_forward_rs.cuh), a __grid_constant__ kernel
// parameter beside ForwardParams.
struct ForwardTileMaps {
  CUtensorMap q, k, v;  // (b, t, h, 128) panels of the inputs
  CUtensorMap inverse;  // Ag rows (the gated inverse, in the input dtype), (b, t, hv, 64): one panel
  // v4's chunk_states where it writes them (encode_states_map), else zeros: [chunk, hv, 128 rows] x
  // 128, boxes of 64 rows x 64 columns (a state group's staged panel)
  CUtensorMap states{};
};

// The maps of p's q, k, v and gated inverse (f16: fp16, else bf16); the first failing status.
inline CUresult encode_forward_maps(const ForwardParams& p, bool f16, ForwardTileMaps* maps) {
  const auto tokens = static_cast<uint64_t>(p.seqlen), batch = static_cast<uint64_t>(p.batch);
  const auto qk_heads = static_cast<uint64_t>(p.num_qk_heads), v_heads = static_cast<uint64_t>(p.num_v_heads);
  const auto inputs = [&](CUtensorMap* map, const void* base, const RowStrides& s, uint64_t heads) {
    return encode_token_map(map, base, batch, tokens, heads, 128, s.batch, s.token, s.head, f16);
  };
  const int64_t inverse_row = static_cast<int64_t>(v_heads) * 64;
  for (const CUresult r : {inputs(&maps->q, p.q, p.q_strides, qk_heads), inputs(&maps->k, p.k, p.k_strides, qk_heads),
                           inputs(&maps->v, p.v, p.v_strides, v_heads),
                           encode_token_map(&maps->inverse, p.inverse, batch, tokens, v_heads, 64,
                                            p.seqlen * inverse_row, inverse_row, 64, f16)})
    if (r != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

// maps->states over p.chunk_states (p.max_chunks blocks of [hv][128][128]).
inline CUresult encode_states_map(const ForwardParams& p, bool f16, ForwardTileMaps* maps) {
  const auto rows = static_cast<uint64_t>(p.max_chunks) * static_cast<uint64_t>(p.num_v_heads) * 128;
  return encode_panel_map(&maps->states, p.chunk_states, rows, 128, 256, 64, f16);
}

// The gradient pass's boxes (backward_grads.cuh): v4's maps over q, k, v and the gated inverse, dO,
// and the per-chunk state tables (chunk_states, chunk_grad_states: [chunk, hv, 128 rows] x 128, boxes
// of 128 rows x 64 columns, one [128][64] panel each).
struct BackwardTileMaps {
  ForwardTileMaps inputs;
  CUtensorMap d_o;
  CUtensorMap states, grad_states;
  // The outputs dv, and dq, dk where the pass writes them in q's dtype (direct_qk, group_sums): a
  // full chunk's staged panels are stored by TMA where every such map encoded (tma_outputs), else in
  // 16-byte row pieces.
  CUtensorMap dv, dq, dk;
  bool tma_outputs;
};

inline CUresult encode_backward_maps(const ForwardParams& p, const void* d_o, const RowStrides& d_o_strides,
                                     const void* grad_states, int64_t chunks, bool f16, BackwardTileMaps* maps) {
  if (auto r = encode_forward_maps(p, f16, &maps->inputs); r != CUDA_SUCCESS) return r;
  const auto rows = static_cast<uint64_t>(chunks) * static_cast<uint64_t>(p.num_v_heads) * 128;
  for (const CUresult r : {encode_token_map(&maps->d_o, d_o, static_cast<uint64_t>(p.batch),
                                            static_cast<uint64_t>(p.seqlen), static_cast<uint64_t>(p.num_v_heads), 128,
                                            d_o_strides.batch, d_o_strides.token, d_o_strides.head, f16),
                           encode_panel_map(&maps->states, p.chunk_states, rows, 128, 256, 128, f16),
                           encode_panel_map(&maps->grad_states, grad_states, rows, 128, 256, 128, f16)})
    if (r != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

}  // namespace flashgdn::kern
