// Host side of the TMA loads (tma.cuh): a 2-D tensor map over rows of bf16/fp16 elements whose
// boxes land in shared memory in the 128-byte-swizzled panel layout of wgmma.cuh. Plain C++.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashgdn::kern {

// Tensor [rows][cols] of 2-byte elements, `row_stride_bytes` apart (a multiple of 16); boxes of
// box_rows x 64 elements (one swizzled panel). The driver function comes through the runtime's
// entry-point query, so nothing links libcuda (a build without a driver still loads). Returns the
// driver's status (CUDA_ERROR_NOT_FOUND when the entry point is missing).
inline CUresult encode_panel_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                                 uint64_t row_stride_bytes, uint32_t box_rows, bool f16) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || entry == nullptr)
    return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return reinterpret_cast<Encode>(entry)(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                         2, const_cast<void*>(base), dims, strides, box, element_strides,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace flashgdn::kern
