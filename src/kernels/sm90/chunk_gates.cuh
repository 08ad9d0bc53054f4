// The gates of one chunk, shared by the fused forward and backward kernels.
#pragma once

#include <cuda_bf16.h>

#include "kernels/sm90/params.h"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

// Warp 0 (two rows per lane): gcum = log2(e) * inclusive cumsum of the chunk's gates, 0 past the
// valid rows (so gcum[63] = gamma in log2 units), and beta of each row (0 past the valid rows),
// into the kernel's shared-memory arrays gcum[64] and beta[64].
__device__ __forceinline__ void load_chunk_gates(const ForwardParams& p, float* gcum, float* beta_out, int64_t b,
                                                 int64_t t0, int rows, int h) {
  const int lane = threadIdx.x;
  float g[2], beta[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = 2 * lane + i;
    g[i] = 0.f;
    beta[i] = 0.f;
    if (row < rows) {
      const int64_t t = t0 + row;
      g[i] = kLog2e * p.g[b * p.g_strides.batch + t * p.g_strides.token + h * p.g_strides.head];
      const int64_t off = b * p.beta_strides.batch + t * p.beta_strides.token + h * p.beta_strides.head;
      beta[i] = p.beta_is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[off])
                               : static_cast<const float*>(p.beta)[off];
    }
  }
  const float pair = g[0] + g[1];
  float inclusive = pair;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const float up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  gcum[2 * lane] = inclusive - pair + g[0];
  gcum[2 * lane + 1] = inclusive;
  beta_out[2 * lane] = beta[0];
  beta_out[2 * lane + 1] = beta[1];
}

}  // namespace flashgdn::kern
