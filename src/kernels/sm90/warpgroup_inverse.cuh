// The chunk inverse inside a fused kernel: one warpgroup (128 threads, 4 warps) turns K K^T, as the
// m64n64 wgmma accumulator it has just formed, into
//     X = A_r = (I + L)^{-1},   L = diag(beta) StrictLower(K K^T)          [64,64]
// (gate-free, DESIGN §1: a forward re-applies G elementwise), with no barrier but the warpgroup's.
// Tested on the GPU by tests/gpu_unit/warpgroup_inverse_test.cu (float64 reference, cycles).
//
// Layout: warp w owns the accumulator's 16-row band w (wgmma.cuh), which is block row w of the
// 16 x 16 block structure (X_ij: block row i, block column j). In shared memory: the workspace
// (L in fp16, Tile [64][72], and L's diagonal blocks in fp32 [4][16][16], transposed: 13 KiB) and
// X's fp16 tile (9 KiB), which the caller places. X's blocks above the diagonal are never formed
// (read them as 0). With a copy (ScaledCopy), every stage also writes the X entries it forms, times
// their column's factor (the fused forward's beta_t 2^-gcum[t]), in bf16 into the copy's tile, a
// 128B-swizzled K-major [64][64] tile (wgmma.cuh swizzled_offset: a wgmma B operand; the fused
// forward's folded chunks), rounded once from fp32; its blocks above the diagonal are never written
// (the caller keeps them zero).
// Stages, the last three separated by the warpgroup's named barrier:
//   1. store_l (warp w): its band of L left of the diagonal block in fp16, and L_ww in fp32 (beta
//      applied to the rows here, once)
//   2. X_ww = (I + L_ww)^{-1} (warp w, lane c < 16: column c by column-oriented forward
//      substitution in fp32 registers; the entries above the diagonal come out as exact zeros)
//   3. 16 -> 32 (warp w: block b = 1 + 2 (w / 2), the 8 columns n = 16 (b - 1) + 8 (w % 2) ..):
//        T [16,8]      = L_{b,b-1} [16,16] @ X_{b-1,b-1}[:, n] [16,8]
//        X_{b,b-1}[:, n] = -X_bb [16,16] @ T
//   4. 32 -> 64 (warp w: the 8 columns n = 8 w .. of the lower-left 32 x 32 quarter; X_A = X's
//      top-left quarter, X_B its bottom-right, both lower block-triangular):
//        T_m [16,8]  = sum_kb L_{m,kb} @ X_{kb}[:, n]     m = 2, 3; kb = n / 16 .. 1 (X_A's zeros skipped)
//        X_{2}[:, n] = -X_22 @ T_2;   X_{3}[:, n] = -(X_32 @ T_2 + X_33 @ T_3)
//      T stays in registers as the next product's B fragment (movmatrix), so a level needs no
//      barrier inside it.
// Precision: the merges are plain fp16 products (fp32 accumulation; L, X and T rounded to fp16's
// 11 bits), one mma.sync a product. bench/forward_precision (float64 emulation of v5's forward):
// the forward's o within 1.3% of bf16x3 merges (three products each, 2^-16) in every regime, where
// plain bf16 (8 bits) loses up to 47%. Range: |X| <= 1 with unit keys and beta <= 1, ~2 with beta
// up to 2, ~4 with keys of norm 1.5 (float64 draws), so far from fp16's 65504 while beta |k|^2 stays
// near the delta rule's stable range (<= 2); keys far longer (not normalised) can overflow it into
// Inf where bf16x3 stayed finite: o then holds Inf / NaN (tests/gpu/test_forward.py:
// test_expansive_keys_fail_loudly), and inverse_fp32 serves such keys.

#pragma once

#include "kernels/sm90/params.h"
#include "kernels/sm90/warp_mma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace flashgdn::kern {

struct WarpgroupInverse {
  static constexpr int kPitch = kChunk + 8;  // fp16 elements a row: the 8 rows an ldmatrix reads hit distinct banks

  // The copy X diag(scale) in bf16 into `tile` (scale: 64 column factors in shared memory, which every
  // thread of the warpgroup can read when invert starts); a null tile: no copy.
  struct ScaledCopy {
    unsigned char* tile = nullptr;
    const float* column_scale = nullptr;
    bool enabled = tile != nullptr;  // a flag, not a generic-pointer compare (64-bit, per stage)
    __device__ __forceinline__ float scale(int col) const { return column_scale[col]; }
  };

  using Tile = HalfTile<kChunk, kPitch>;  // [64][64] fp16, row-major

  struct Workspace {
    Tile l;                     // diag(beta) StrictLower(K K^T), the blocks left of the diagonal
    float l_diag_t[4][16][16];  // L's diagonal blocks in fp32, transposed: [w][j][i] = L_ww[i][j]
  };
  // X itself is a separate Tile (on and below the block diagonal), so that a kernel can keep one
  // per pipeline slot.

  static __device__ __forceinline__ void sync(int barrier) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
  }

  // Stage 1: kk is the m64n64 accumulator of K K^T (wgmma.cuh layout), beta the chunk's 64 betas
  // (0 past its end); warp w writes the blocks of band w the later stages read: those left of the
  // diagonal into ws.l, L_ww in fp32 into ws.l_diag_t (the rest of ws.l is never read).
  static __device__ __forceinline__ void store_l(Workspace& ws, const float (&kk)[32], const float* beta) {
    // Branch-free: the fp16 blocks left of the diagonal by one stmatrix_x4 per column-block pair jj
    // (matrices (j = 2 jj + m / 2, row half m % 2)), issued only where jj < warp (predicated); L_ww's
    // two column blocks j = 2 warp, 2 warp + 1 picked from the accumulator by warp-uniform selects.
    // Entries on and above L_ww's diagonal are stored unmasked: stage 2 never reads them (the fused
    // forward keeping the inverse cache reads the diagonal, beta_t |k_t|^2, for its window terms).
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, r = lane / 4, c_lane = 2 * (lane % 4);
    const float beta_rows[2] = {beta[16 * warp + r], beta[16 * warp + r + 8]};
#pragma unroll
    for (int jj = 0; jj < 3; ++jj) {
      uint32_t regs[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = 2 * jj + m / 2, h = m % 2;
        const __half2 pair = __floats2half2_rn(beta_rows[h] * kk[4 * j + 2 * h], beta_rows[h] * kk[4 * j + 2 * h + 1]);
        regs[m] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      const int m = lane / 8;
      if (jj < warp)
        stmatrix_x4(&ws.l.v[(16 * warp + 8 * (m % 2) + lane % 8) * kPitch + 8 * (2 * jj + m / 2)], regs);
    }
#pragma unroll
    for (int jd = 0; jd < 2; ++jd)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x = 4 * jd + 2 * h + e;  // element of column block j = 2 warp + jd: kk[8 warp + x]
          const float v = warp == 0 ? kk[x] : warp == 1 ? kk[8 + x] : warp == 2 ? kk[16 + x] : kk[24 + x];
          ws.l_diag_t[warp][8 * jd + c_lane + e][r + 8 * h] = beta_rows[h] * v;
        }
    __syncwarp();  // stage 2 reads the warp's own L_ww
  }

  // Stages 2-4; X complete in x (and in the copy's tile unless null) when it returns (all 128 threads
  // pass `barrier`). stage_done(i) runs after stage 2 + i's barrier (i = 0, 1: a timeline's marks).
  template <typename StageDone>
  static __device__ __forceinline__ void invert(const Workspace& ws, Tile& x, const ScaledCopy& copy, int barrier,
                                                StageDone&& stage_done) {
    invert_diagonal(ws, x, copy);
    sync(barrier);
    stage_done(0);
    merge_16_to_32(ws, x, copy);
    sync(barrier);
    stage_done(1);
    merge_32_to_64(ws, x, copy);
    sync(barrier);
  }
  static __device__ __forceinline__ void invert(const Workspace& ws, Tile& x, int barrier) {
    invert(ws, x, ScaledCopy{}, barrier, [](int) {});
  }

  // 2. X_ww[:, c] solves (I + L_ww) x = e_c, column-oriented: once x_j is final it is taken out of
  //    every later row (the 15 - j updates of step j are independent, so the chain is 16 steps),
  //    L_ww's column j read as broadcast float4 vectors of the transposed block.
  static __device__ __forceinline__ void invert_diagonal(const Workspace& ws, Tile& x_tile,
                                                         const ScaledCopy& copy) {
    // Lanes c and c + 16 both solve column c (the same instructions: no extra issue); lane c stores
    // its rows 0-7, lane c + 16 rows 8-15 (half the store instructions a warp).
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 16, half = (threadIdx.x / 16) % 2;
    const float(&l_t)[16][16] = ws.l_diag_t[warp];
    const int base = 16 * warp;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = i == lane ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < 15; ++j)
#pragma unroll
      for (int v = (j + 1) / 4; v < 4; ++v) {  // column j of L_ww, rows 4 v .. 4 v + 3: one broadcast vector
        const float4 l = *reinterpret_cast<const float4*>(&l_t[j][4 * v]);
        const float column[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (4 * v + e > j) x[4 * v + e] -= column[e] * x[j];
      }
    float mine[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) mine[i] = half ? x[i + 8] : x[i];
    const int row0 = base + 8 * half;
#pragma unroll
    for (int i = 0; i < 8; ++i) x_tile.store(row0 + i, base + lane, mine[i]);
    if (copy.enabled) {
      const float scale = copy.scale(base + lane);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        *reinterpret_cast<__nv_bfloat16*>(copy.tile + wg::swizzled_offset(row0 + i, base + lane)) =
            __float2bfloat16_rn(scale * mine[i]);
    }
  }

  // 3. 16 -> 32: X_10 (warps 0, 1) and X_32 (warps 2, 3), 8 columns each.
  static __device__ __forceinline__ void merge_16_to_32(const Workspace& ws, Tile& x, const ScaledCopy& copy) {
    const int warp = (threadIdx.x / 32) % 4;
    const int b = 1 + 2 * (warp / 2), r0 = 16 * b, n0 = 16 * (b - 1) + 8 * (warp % 2);
    Fp16A a;
    Fp16B x_block;
    float t[4] = {0.f, 0.f, 0.f, 0.f}, x_new[4] = {0.f, 0.f, 0.f, 0.f};
    ws.l.a_fragment(a, r0, r0 - 16);
    x.b_fragment(x_block, r0 - 16, n0);
    mma_merge(t, a, x_block);
    x.a_fragment(a, r0, r0);
    mma_merge(x_new, a, Tile::as_b(t));
    store_negated(x, copy, r0, n0, x_new);
  }

  // 4. 32 -> 64: X[32:64, 8 w .. 8 w + 7].
  static __device__ __forceinline__ void merge_32_to_64(const Workspace& ws, Tile& x, const ScaledCopy& copy) {
    const int warp = (threadIdx.x / 32) % 4;
    const int n0 = 8 * warp, first_kb = n0 / 16;
    Fp16A a;
    Fp16B x_block;
    float t2[4] = {0.f, 0.f, 0.f, 0.f}, t3[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
      if (kb < first_kb) continue;  // X_A[kb, n] = 0 above the block diagonal
      x.b_fragment(x_block, 16 * kb, n0);
      ws.l.a_fragment(a, 32, 16 * kb);
      mma_merge(t2, a, x_block);
      ws.l.a_fragment(a, 48, 16 * kb);
      mma_merge(t3, a, x_block);
    }
    const Fp16B t2_b = Tile::as_b(t2), t3_b = Tile::as_b(t3);
    float x2[4] = {0.f, 0.f, 0.f, 0.f}, x3[4] = {0.f, 0.f, 0.f, 0.f};
    x.a_fragment(a, 32, 32);
    mma_merge(x2, a, t2_b);
    x.a_fragment(a, 48, 32);
    mma_merge(x3, a, t2_b);
    x.a_fragment(a, 48, 48);
    mma_merge(x3, a, t3_b);
    store_negated(x, copy, 32, n0, x2);
    store_negated(x, copy, 48, n0, x3);
  }

 private:
  // -(the [16,8] product at (r0, n0)) into an fp16 tile (and the scaled bf16 copy unless null).
  static __device__ __forceinline__ void store_negated(Tile& tile, const ScaledCopy& copy, int r0, int n0,
                                                       const float (&acc)[4]) {
    const int row = acc_row(r0, 0, 0), col = acc_col(n0, 0, 0);
    tile.store_pair(row, col, -acc[0], -acc[1]);
    tile.store_pair(row + 8, col, -acc[2], -acc[3]);
    if (copy.enabled) {
      const float scale0 = -copy.scale(col), scale1 = -copy.scale(col + 1);
      *reinterpret_cast<__nv_bfloat162*>(copy.tile + wg::swizzled_offset(row, col)) =
          __floats2bfloat162_rn(scale0 * acc[0], scale1 * acc[1]);
      *reinterpret_cast<__nv_bfloat162*>(copy.tile + wg::swizzled_offset(row + 8, col)) =
          __floats2bfloat162_rn(scale0 * acc[2], scale1 * acc[3]);
    }
  }
};

}  // namespace flashgdn::kern
