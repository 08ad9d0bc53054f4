// The gates of one chunk, shared by the fused forward and backward kernels. The chunk inverse also
// writes them as a record per (chunk id, v-head) (ForwardParams::chunk_gates): gcum[64] then
// beta[64], fp32, as store_chunk_gates lays them out; the v4 forward copies it with one bulk TMA.
#pragma once

#include <cuda_bf16.h>

#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

// A chunk's gates in log2 units and its betas, two rows per lane of one warp (0 past the valid rows);
// fetched one chunk ahead by the forward so that their latency stays off its chain.
struct ChunkGates {
  float g[2] = {0.f, 0.f}, beta[2] = {0.f, 0.f};
};

// The same rows' raw words, loaded with no use, so that the loads can stay in flight (across a
// barrier) until decode_chunk_gates: g in fp32, beta's fp32 bits or its bf16's in the low half. Rows
// past the chunk load row 0's (a valid address); decoding zeroes them.
struct RawChunkGates {
  float g[2] = {0.f, 0.f};
  uint32_t beta[2] = {0u, 0u};
};

__device__ __forceinline__ RawChunkGates fetch_raw_chunk_gates(const ForwardParams& p, int64_t b, int64_t t0, int rows,
                                                               int h) {
  RawChunkGates raw;
  const int lane = threadIdx.x % 32;  // one warp
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = 2 * lane + i;
    const int64_t t = t0 + (row < rows ? row : 0);
    raw.g[i] = p.g[b * p.g_strides.batch + t * p.g_strides.token + h * p.g_strides.head];
    const int64_t at = beta_index(p, b, t, h);
    if (p.beta_is_bf16)
      raw.beta[i] = static_cast<const uint16_t*>(p.beta)[at];
    else
      raw.beta[i] = static_cast<const uint32_t*>(p.beta)[at];
  }
  return raw;
}

// The words pass through an empty volatile asm first: the compiler cannot then hoist the decode's
// multiplies and shifts above a barrier between the fetch and the decode (and the loads' wait with them).
__device__ __forceinline__ ChunkGates decode_chunk_gates(const ForwardParams& p, RawChunkGates raw, int rows) {
  ChunkGates gates;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+f"(raw.g[i]), "+r"(raw.beta[i]));
    if (2 * lane + i < rows) {
      gates.g[i] = kLog2e * raw.g[i];
      gates.beta[i] = p.beta_is_bf16 ? __uint_as_float(raw.beta[i] << 16) : __uint_as_float(raw.beta[i]);
    }
  }
  return gates;
}

__device__ __forceinline__ ChunkGates fetch_chunk_gates(const ForwardParams& p, int64_t b, int64_t t0, int rows,
                                                        int h) {
  return decode_chunk_gates(p, fetch_raw_chunk_gates(p, b, t0, rows, h), rows);
}

// One warp: gcum = inclusive cumsum of the log2 gates (flat past the valid rows, so gcum[63] = gamma
// in log2 units) and beta, into the kernel's shared arrays gcum[64] and beta[64].
__device__ __forceinline__ void store_chunk_gates(float* gcum, float* beta, const ChunkGates& gates) {
  const int lane = threadIdx.x % 32;  // one warp
  const float pair = gates.g[0] + gates.g[1];
  const float inclusive = warp_inclusive_sum(pair);
  gcum[2 * lane] = inclusive - pair + gates.g[0];
  gcum[2 * lane + 1] = inclusive;
  beta[2 * lane] = gates.beta[0];
  beta[2 * lane + 1] = gates.beta[1];
}

// The decay-window terms (ForwardParams::chunk_window_terms; plan/decay_window.h): a chunk's term is the
// sum over its tokens of g_t + window_growth(beta_t |k_t|^2), where window_growth is the log of the
// largest gain of the token's I - beta_t k_t k_t^T (1 off k_t, 1 - beta_t |k_t|^2 along it), 0 unless
// beta_t |k_t|^2 > 2. The chunk inverse, v5 keeping the inverse cache and the CP window scan form it.
__device__ __forceinline__ float window_growth(float beta_norm2) { return logf(fmaxf(1.f, fabsf(1.f - beta_norm2))); }
// The chunk's term from its gates' sum (gcum[63], log2 units) and its growth terms' sum.
__device__ __forceinline__ float chunk_window_term(float gamma_log2, float growth) {
  return gamma_log2 / kLog2e + growth;
}

// Both at once (warp 0).
__device__ __forceinline__ void load_chunk_gates(const ForwardParams& p, float* gcum, float* beta, int64_t b,
                                                 int64_t t0, int rows, int h) {
  store_chunk_gates(gcum, beta, fetch_chunk_gates(p, b, t0, rows, h));
}

}  // namespace flashgdn::kern
