// One step of the CP chains (cp_kernels.cu), next = base + A S on a [128, kCols] column slice of a
// [128][128] state (kCols 32 or 16: 4 or 8 CTAs a state), with A = M or M^T (fp32, [128][128]) and S
// the running slice: the operand layouts and the warpgroup product. A CTA of kChainThreads = 256
// threads (2 warpgroups); tested on the GPU by tests/gpu_unit/chain_step_test.cu against a float64
// product.
//   M: four [128 rows][32] fp32 column panels as TMA boxes with 128-byte swizzle land
//      (tma::fp32_panel_offset); the base slice one such panel (its first kCols columns).
//   S: SliceBuffer, S^T [kCols n][128 k] bf16 hi and lo K-major panels (the wgmma B operand).
//   A: split into registers per k-half (HalfA, load_step_a), two commit groups (issue_step_half).
//   result: store_step -> the next running slice (stmatrix .trans) and a [128][128] fp32 state.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/sm90/params.h"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/warp_mma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace flashgdn::kern::chain {

constexpr int kPanelCols = 32;             // fp32 columns of one 128-byte-swizzled panel (a TMA box)
constexpr int kPanelBytes = kHeadDim * kPanelCols * 4;  // [128 rows][32] fp32: 16 KiB
constexpr int kChainThreads = 256;         // 2 warpgroups, group g owns slice rows 64 g .. 64 g + 63

// The running slice S [128 k, kCols n] as the steps' wgmma B operand: S^T [kCols n][128 k] K-major,
// bf16 hi and lo (hi + lo within 2^-17 of the fp32 value), each plane two 128-byte-swizzled panels of
// 64 k (wgmma.cuh's tile layout, kCols rows a panel).
template <int kCols>
struct SliceBuffer {
  static_assert(kCols == 16 || kCols == 32, "m64n16k16 or m64n32k16 steps; a base slice within one panel");
  static constexpr int kPanelBytes = kCols * 64 * 2;  // [kCols rows][64] bf16: 2 or 4 KiB
  alignas(1024) unsigned char hi[2 * kPanelBytes];
  alignas(1024) unsigned char lo[2 * kPanelBytes];

  __device__ __forceinline__ void store(int k, int n, float x) {
    const uint32_t at = wg::tile_offset(n, k, kCols);
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    *reinterpret_cast<__nv_bfloat16*>(hi + at) = h;
    *reinterpret_cast<__nv_bfloat16*>(lo + at) = __float2bfloat16_rn(x - __bfloat162float(h));
  }
  __device__ __forceinline__ float value(int k, int n) const {
    const uint32_t at = wg::tile_offset(n, k, kCols);
    return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(hi + at)) +
           __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(lo + at));
  }
};

// Element (row, col) of a [128][32] fp32 panel as the TMA box left it (tma::fp32_panel_offset).
__device__ __forceinline__ const float* panel_element(const unsigned char* panel, int row, int col) {
  return reinterpret_cast<const float*>(panel + tma::fp32_panel_offset(row, col));
}

// The product of a step, on tensor cores in bf16x3 (hi.hi + hi.lo + lo.hi: ~2^-16 relative per
// product), warpgroup g forming rows 64 g .. 64 g + 63 of
//   next[64,kCols] = base + A[64 g : 64 g + 64, 0:128] @ S[128,kCols]   (8 k-steps x 3 RS wgmma
//   m64nk16, n = kCols)
// with A = M or, transposed, M^T, and S the running slice (B, from shared memory), in two commit
// groups of 4 k-steps (k-half 0, 1), so that half 0's registers are free again (wg::wait<1>) while
// half 1 runs. Thread layout: warp w of the group holds A's rows 16 w .. 16 w + 15 as mma.sync m16k16
// A fragments, split from M's fp32 panels (split_pair), and accumulator element 4 j + e at row
// 64 g + 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2 (lane l).
struct HalfA {
  uint32_t hi[4][4], lo[4][4];  // k-step 4 half + i: A's columns 16 (4 half + i) .. + 15
};

__device__ __forceinline__ int step_row0() {  // the thread's first accumulator row
  return 64 * (threadIdx.x / 128) + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;
}

// The base slice (the first kCols columns of a [128][32] fp32 panel) at the accumulator's positions.
template <int kCols>
__device__ __forceinline__ void load_step_base(const unsigned char* base_panel, float (&base)[kCols / 2]) {
  const int row0 = step_row0(), c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 b = *reinterpret_cast<const float2*>(panel_element(base_panel, row0 + 8 * half, 8 * j + c));
      base[4 * j + 2 * half] = b.x, base[4 * j + 2 * half + 1] = b.y;
    }
}

// k-half `half` of M (or M^T), four [128][32] fp32 column panels, as A fragments: a[q] of k-step ks
// is the pair (row m0 + r + 8 (q % 2), columns k, k + 1), k = 16 ks + 2 (l % 4) + 8 (q / 2).
template <bool kTransposed>
__device__ __forceinline__ void load_step_a(const unsigned char (*m_panels)[kPanelBytes], int half, HalfA& a) {
  const int row0 = step_row0(), c = 2 * (threadIdx.x % 4);
  auto m_at = [&](int row, int col) { return panel_element(m_panels[col / kPanelCols], row, col % kPanelCols); };
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = row0 + 8 * (q % 2), k = 16 * (4 * half + i) + c + 8 * (q / 2);
      if constexpr (kTransposed) {  // A[i][k] = M[k][i]
        split_pair(*m_at(k, row), *m_at(k + 1, row), a.hi[i][q], a.lo[i][q]);
      } else {
        const float2 pair = *reinterpret_cast<const float2*>(m_at(row, k));
        split_pair(pair.x, pair.y, a.hi[i][q], a.lo[i][q]);
      }
    }
}

// acc (+)= A[:, k-half] @ S[k-half, :]: 12 wgmmas issued and committed as one group, not waited for.
template <int kCols>
__device__ __forceinline__ void issue_step_half(float (&acc)[kCols / 2], const HalfA& a, int half,
                                                const SliceBuffer<kCols>& s_in) {
  using wg::Major;
  wg::fence_operand(acc);
  wg::fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k0 = 16 * (4 * half + i);
    const uint64_t b_hi = wg::descriptor<Major::kK>(s_in.hi, k0, kCols);
    const uint64_t b_lo = wg::descriptor<Major::kK>(s_in.lo, k0, kCols);
    wg::mma_rs<__nv_bfloat16, kCols, Major::kK>(acc, a.lo[i], b_hi, true);
    wg::mma_rs<__nv_bfloat16, kCols, Major::kK>(acc, a.hi[i], b_lo, true);
    wg::mma_rs<__nv_bfloat16, kCols, Major::kK>(acc, a.hi[i], b_hi, true);
  }
  wg::commit();
}

// A step's result (waited for) -> the running slice s_out (null: not kept; S^T hi and lo: the
// accumulator's 8x8 blocks, rows 16 w + 8 h and columns 8 j, stored transposed by stmatrix; x4 a = blocks j = 2 a + q / 2,
// h = q % 2, lane L addressing row L % 8 of block L / 8, i.e. S^T row 8 j + L % 8 at k = 64 g + 16 w
// + 8 h) and to `out` (a [128][128] fp32 workspace state; null: nowhere); the slice writes made
// visible to wgmma.
template <int kCols>
__device__ __forceinline__ void store_step(const float (&acc)[kCols / 2], SliceBuffer<kCols>* s_out, float* out,
                                           int col0) {
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int x4 = 0; x4 < kCols / 16 && s_out != nullptr; ++x4) {
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = 2 * x4 + q / 2, h = q % 2;
      split_pair(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], hi[q], lo[q]);
    }
    const int q = lane / 8, n = 8 * (2 * x4 + q / 2) + lane % 8, k = 64 * group + 16 * warp + 8 * (q % 2);
    const uint32_t at = wg::tile_offset(n, k, kCols);
    stmatrix_x4_trans(s_out->hi + at, hi);
    stmatrix_x4_trans(s_out->lo + at, lo);
  }
  if (out != nullptr) {
    const int row0 = step_row0(), c = 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(&out[(row0 + 8 * half) * kHeadDim + col0 + 8 * j + c]) =
            make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
  }
  wg::fence_shared_to_async();
}

}  // namespace flashgdn::kern::chain
