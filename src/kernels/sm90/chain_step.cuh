// One step of the CP chains (cp_kernels.cu), next = base + A S on a [128, kCols] column slice of a
// [128][128] state (kCols 32 or 16: 4 or 8 CTAs a state), with A = M or M^T (fp32, [128][128]) and S
// the running slice: the operand layouts and the warpgroup product. A CTA of kChainThreads = 256
// threads (2 warpgroups); tested on the GPU by tests/gpu_unit/chain_step_test.cu against a float64
// product.
//   M: four [128 rows][32] fp32 column panels as TMA boxes with 128-byte swizzle land
//      (tma::fp32_panel_offset); the base slice one such panel (its first kCols columns).
//   S: SliceBuffer, S^T [kCols n][128 k] bf16 hi and lo K-major panels (the wgmma B operand).
//   Slots: the step runs in a permuted basis, slot i of every row dimension (A's rows and columns,
//   the slice's k, the accumulator's rows) holding state row slot_row(i) (a permutation within each
//   aligned 8: slots 2m, 2m + 1 hold rows m, m + 4), so that a thread's A pair (k slots 2m, 2m + 1)
//   is M's columns m and m + 4, which ldmatrix delivers from the fp32 panels without bank conflicts
//   (a row-major pair of adjacent columns is 2-way conflicted per half-warp: rows r and r ^ 1 share
//   their two 16-byte units under the 128-byte swizzle). next = base + A S is the same product in
//   either basis; the step's inputs and outputs are read and written at slot_row(slot). With A = M^T
//   (kTransposed: the gradient chains) the pairs of odd m are the other way round (slots 2m, 2m + 1
//   hold rows m + 4, m), so that the row each lane loads first is its pair's first element (the
//   conflict-free load order of load_step_a; the common basis took a select per element). Every
//   function that places state rows in slots takes kTransposed, and a chain uses one basis throughout.
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

// State row of slot i (header comment; kTransposed: A = M^T's basis) and its inverse.
template <bool kTransposed = false>
__host__ __device__ constexpr int slot_row(int slot) {
  const int m = (slot & 7) >> 1, second = slot & 1;
  return (slot & ~7) | (m + 4 * (kTransposed ? second ^ (m & 1) : second));
}
template <bool kTransposed = false>
__host__ __device__ constexpr int row_slot(int row) {
  const int m = row & 3, upper = (row >> 2) & 1;
  return (row & ~7) | (2 * m + (kTransposed ? upper ^ (m & 1) : upper));
}
static_assert(slot_row(0) == 0 && slot_row(1) == 4 && slot_row(2) == 1 && slot_row(7) == 7 && slot_row(13) == 14 &&
                  row_slot(slot_row(13)) == 13 && row_slot(5) == 3 && slot_row(row_slot(126)) == 126,
              "slots 2m, 2m + 1 of each aligned 8 hold rows m, m + 4");
static_assert(slot_row<true>(0) == 0 && slot_row<true>(1) == 4 && slot_row<true>(2) == 5 && slot_row<true>(3) == 1 &&
                  slot_row<true>(7) == 3 && slot_row<true>(13) == 14 && slot_row<true>(11) == 9 && row_slot<true>(slot_row<true>(13)) == 13 &&
                  row_slot<true>(5) == 2 && slot_row<true>(row_slot<true>(126)) == 126,
              "A = M^T: slots 2m, 2m + 1 hold rows m, m + 4 for even m and m + 4, m for odd m");

// The running slice S [128 k, kCols n] as the steps' wgmma B operand: S^T [kCols n][128 k slots]
// K-major, bf16 hi and lo (hi + lo within 2^-17 of the fp32 value), each plane two 128-byte-swizzled
// panels of 64 k (wgmma.cuh's tile layout, kCols rows a panel); store and value take the state row k
// (at slot row_slot<kTransposed>(k), the chain's basis).
template <int kCols>
struct SliceBuffer {
  static_assert(kCols == 16 || kCols == 32, "m64n16k16 or m64n32k16 steps; a base slice within one panel");
  static constexpr int kPanelBytes = kCols * 64 * 2;  // [kCols rows][64] bf16: 2 or 4 KiB
  alignas(1024) unsigned char hi[2 * kPanelBytes];
  alignas(1024) unsigned char lo[2 * kPanelBytes];

  template <bool kTransposed = false>
  __device__ __forceinline__ void store(int k, int n, float x) {
    const uint32_t at = wg::tile_offset(n, row_slot<kTransposed>(k), kCols);
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    *reinterpret_cast<__nv_bfloat16*>(hi + at) = h;
    *reinterpret_cast<__nv_bfloat16*>(lo + at) = __float2bfloat16_rn(x - __bfloat162float(h));
  }
  template <bool kTransposed = false>
  __device__ __forceinline__ float value(int k, int n) const {
    const uint32_t at = wg::tile_offset(n, row_slot<kTransposed>(k), kCols);
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
// half 1 runs. Thread layout: warp w of the group holds A's row slots 16 w .. 16 w + 15 as mma.sync
// m16k16 A fragments, split from M's fp32 panels (split_pair), and accumulator element 4 j + e at
// row slot 64 g + 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2 (lane l).
struct HalfA {
  uint32_t hi[4][4], lo[4][4];  // k-step 4 half + i: A's columns 16 (4 half + i) .. + 15
};

__device__ __forceinline__ int step_row0() {  // the thread's first accumulator row slot
  return 64 * (threadIdx.x / 128) + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;
}

// The base slice (the first kCols columns of a [128][32] fp32 panel) at the accumulator's positions.
template <int kCols, bool kTransposed = false>
__device__ __forceinline__ void load_step_base(const unsigned char* base_panel, float (&base)[kCols / 2]) {
  const int row0 = step_row0(), c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = slot_row<kTransposed>(row0 + 8 * half);
      const float2 b = *reinterpret_cast<const float2*>(panel_element(base_panel, row, 8 * j + c));
      base[4 * j + 2 * half] = b.x, base[4 * j + 2 * half + 1] = b.y;
    }
}

// k-half `half` of M (or M^T), four [128][32] fp32 column panels, as A fragments in slots: a[q] of
// k-step ks is the pair of k slots 8 b + 2 m, 8 b + 2 m + 1 (b = 2 ks + q / 2, m = l % 4), i.e.
// state columns slot_row<kTransposed>(8 b + 2 m), slot_row<kTransposed>(8 b + 2 m + 1) (8 b + m and
// 8 b + m + 4, in that order but for A = M^T's odd m), in row slot r = 16 w + l / 4 + 8 (q % 2)
// (state row slot_row<kTransposed>(r)).
//   A = M: ldmatrix.x4 on the fp32 panels viewed as b16 (an 8x8 b16 matrix is 8 rows of 4 fp32; lane
//     l receives fp32 column l % 4 of row l / 4): per k-step two x4, matrices (q % 2, column 8 b or
//     8 b + 4), lane L addressing row slot_row(16 w + 8 (q % 2) + L % 8); the 8 rows of a matrix are
//     one aligned 8, their 16-byte units distinct under the swizzle: one wavefront a matrix.
//   A = M^T: A[r][k] = M[slot_row<true>(k)][slot_row<true>(r)], scalar loads of rows
//     slot_row<true>(8 b + 2 m) = 8 b + m + 4 (m % 2) first and then the pair's other row, in column
//     slot_row<true>(r) (rows {0, 5, 2, 7} and then {4, 1, 6, 3} of the aligned 8 in one instruction:
//     distinct unit pairs, one wavefront); each lane's first load is its pair's first element.
template <bool kTransposed>
__device__ __forceinline__ void load_step_a(const unsigned char (*m_panels)[kPanelBytes], int half, HalfA& a) {
  const int lane = threadIdx.x % 32, m = lane % 4;
  const int warp_slot0 = 64 * (threadIdx.x / 128) + 16 * ((threadIdx.x / 32) % 4);  // the warp's first row slot
  auto m_at = [&](int row, int col) { return panel_element(m_panels[col / kPanelCols], row, col % kPanelCols); };
  if constexpr (kTransposed) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        // Column slot_row<true>(r) and rows slot_row<true>(k slots 8 b + 2 m, 8 b + 2 m + 1), written
        // as an aligned 8 plus the lane's part so that the addresses stay base + immediate.
        const int col = warp_slot0 + 8 * (q % 2) + slot_row<true>(lane / 4);
        const int k0 = 8 * (2 * (4 * half + i) + q / 2) + m, odd = m & 1;
        const float first = *m_at(k0 + 4 * odd, col), second = *m_at(k0 + 4 * (1 - odd), col);
        split_pair(first, second, a.hi[i][q], a.lo[i][q]);
      }
  } else {
    // x4 matrix L / 8 of k-step i, load u: row half (L / 8) / 2, column 8 (2 ks + u) + 4 ((L / 8) % 2).
    const int row = slot_row(warp_slot0 + 8 * (lane / 16) + lane % 8), col_in_block = 4 * ((lane / 8) % 2);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int u = 0; u < 2; ++u) {  // q / 2
        uint32_t r[4];  // (q % 2 = 0: columns 8 b + m, 8 b + m + 4), (q % 2 = 1: the same)
        ldmatrix_x4(r, m_at(row, 8 * (2 * (4 * half + i) + u) + col_in_block));
#pragma unroll
        for (int h = 0; h < 2; ++h)  // q % 2
          split_pair(__uint_as_float(r[2 * h]), __uint_as_float(r[2 * h + 1]), a.hi[i][2 * u + h], a.lo[i][2 * u + h]);
      }
  }
}

// A running slice's planes as wgmma descriptor tile words (wg::descriptor_from_word: hi, lo),
// formed once per chain so that a step's descriptors are adds of immediates (re-formed from the
// slice's address, each half's cost a masking chain of uniform operations per plane).
struct SliceWords {
  uint32_t hi, lo;
};
template <int kCols>
__device__ __forceinline__ SliceWords slice_words(const SliceBuffer<kCols>& s) {
  return {static_cast<uint32_t>(wg::encode(smem_addr(s.hi))), static_cast<uint32_t>(wg::encode(smem_addr(s.lo)))};
}

// acc (+)= A[:, k-half] @ S[k-half, :]: 12 wgmmas issued and committed as one group, not waited for.
template <int kCols>
__device__ __forceinline__ void issue_step_half(float (&acc)[kCols / 2], const HalfA& a, int half, SliceWords s_in) {
  using wg::Major;
  wg::fence_operand(acc);
  wg::fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k0 = 16 * (4 * half + i);
    const uint64_t b_hi = wg::descriptor_from_word<Major::kK>(s_in.hi, k0, kCols);
    const uint64_t b_lo = wg::descriptor_from_word<Major::kK>(s_in.lo, k0, kCols);
    wg::mma_rs<__nv_bfloat16, kCols, Major::kK>(acc, a.lo[i], b_hi, true);
    wg::mma_rs<__nv_bfloat16, kCols, Major::kK>(acc, a.hi[i], b_lo, true);
    wg::mma_rs<__nv_bfloat16, kCols, Major::kK>(acc, a.hi[i], b_hi, true);
  }
  wg::commit();
}
template <int kCols>
__device__ __forceinline__ void issue_step_half(float (&acc)[kCols / 2], const HalfA& a, int half,
                                                const SliceBuffer<kCols>& s_in) {
  issue_step_half<kCols>(acc, a, half, slice_words(s_in));
}

// A step's result (waited for) -> the running slice s_out (null: not kept; S^T hi and lo: the
// accumulator's 8x8 blocks, rows 16 w + 8 h and columns 8 j, stored transposed by stmatrix; x4 a = blocks j = 2 a + q / 2,
// h = q % 2, lane L addressing row L % 8 of block L / 8, i.e. S^T row 8 j + L % 8 at k slot 64 g + 16 w
// + 8 h), the slice writes made visible to wgmma, and then to `out` (a [128][128] fp32 workspace
// state; null: nowhere): the global stores come after the proxy fence, whose memory barrier
// (MEMBAR.ALL.CTA) would otherwise wait for them on the chain.
template <bool kTransposed = false, int kCols>
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
  wg::fence_shared_to_async();
  if (out != nullptr) {
    const int row0 = step_row0(), c = 2 * (lane % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float* const row = out + (slot_row<kTransposed>(row0 + 8 * half) * kHeadDim + col0 + c);  // + 8 j: immediates
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) store_global_8(row + 8 * j, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}

}  // namespace flashgdn::kern::chain
