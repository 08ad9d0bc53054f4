// Gate-free chunk inverse:  A_r = (I + StrictLower(diag(beta) K K^T))^{-1}  per (chunk, v-head).
//
// Grid  (max_chunks, Hv); block 256 threads (8 warps); no gates anywhere (DESIGN §1, gate
// extraction: the fused kernel re-applies G elementwise).
// Shared memory: K tile [64][136] bf16 (padded rows), L and X = A_r in fp32 [64][65], a 32x33
// scratch T for the block products; X and T reuse K's bytes.
// Stages:
//   1. KK^T        [64,64] = K[64,128] @ K^T[128,64]        (mma.sync, 8 warps x [16,32] tiles)
//      L[s,t]      = beta_s * KK^T[s,t] for s > t, else 0
//   2. diagonal 16x16 blocks of X by forward substitution (64 threads: one per block column)
//   3. 32x32 blocks:  X21 = -X22 @ (L21 @ X11)   (16x16 blocks, twice)
//   4. 64x64:         X21 = -X22 @ (L21 @ X11)   (32x32 blocks)
// Output: rows of the chunk's valid tokens, 64 values each, at inverse[(b*T + t)*Hv + h][0:64]
// (entries above the diagonal are written as zeros).
#pragma once

#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

template <typename Elem, typename InverseT>
struct ChunkInverse {
  static constexpr int kThreads = 256;
  static constexpr int kPitchK = kHeadDim + 8;  // bf16 elements per K row in shared memory
  static constexpr int kPitchF = kChunk + 1;    // floats per L / X row

  // K is read only by stage 1, X and T only after it (a barrier between): they share storage, so
  // that 6 CTAs fit on an SM instead of 4 (36.9 KiB a CTA).
  struct SharedStorage {
    union {
      alignas(16) Elem k[kChunk * kPitchK];
      struct {
        float x[kChunk * kPitchF];
        float t[32 * 33];
      };
    };
    float l[kChunk * kPitchF];
    float beta[kChunk];
  };

  // out[r0.., c0..] (n x n) = -X22 @ (L21 @ X11) for the diagonal blocks at `r0` (X11, rows/cols
  // r0-n..r0) and `r0` (X22, rows/cols r0..r0+n), n <= 32: rows r0..r0+n, cols r0-n..r0 of X.
  static __device__ void combine(SharedStorage& s, int r0, int n) {
    const int c0 = r0 - n;
    for (int e = threadIdx.x; e < n * n; e += kThreads) {  // T = L21 @ X11
      const int i = e / n, j = e % n;
      float acc = 0.f;
      for (int m = j; m < n; ++m) acc += s.l[(r0 + i) * kPitchF + c0 + m] * s.x[(c0 + m) * kPitchF + c0 + j];
      s.t[i * 33 + j] = acc;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n * n; e += kThreads) {  // X21 = -X22 @ T
      const int i = e / n, j = e % n;
      float acc = 0.f;
      for (int m = 0; m <= i; ++m) acc += s.x[(r0 + i) * kPitchF + r0 + m] * s.t[m * 33 + j];
      s.x[(r0 + i) * kPitchF + c0 + j] = -acc;
    }
    __syncthreads();
  }

  static __device__ void run(const ForwardParams& p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int h = blockIdx.y;
    const int hk = h / (p.num_v_heads / p.num_qk_heads);
    ChunkLocation where;
    if (!locate_chunk(p, blockIdx.x, where)) return;
    const int64_t b = where.seq.batch;

    // K tile: 64 rows x 16 vectors of 16 bytes; rows past the chunk are zero-filled.
    for (int e = threadIdx.x; e < kChunk * 16; e += kThreads) {
      const int row = e / 16, vec = e % 16;
      const bool valid = row < where.rows;
      const Elem* src = row_ptr<Elem>(p.k, p.k_strides, b, valid ? where.first_token + row : 0, hk) + vec * 8;
      cp_async_16(&s.k[row * kPitchK + vec * 8], src, valid);
    }
    cp_async_commit();
    if (threadIdx.x < kChunk) {
      const int row = threadIdx.x;
      float beta = 0.f;
      if (row < where.rows) {
        const int64_t off = b * p.beta_strides.batch + (where.first_token + row) * p.beta_strides.token +
                            h * p.beta_strides.head;
        beta = p.beta_is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[off])
                              : static_cast<const float*>(p.beta)[off];
      }
      s.beta[row] = beta;
    }
    cp_async_wait<0>();
    __syncthreads();

    // 1. L = StrictLower(diag(beta) K K^T).
    {
      const int warp = threadIdx.x / 32;
      const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
      float acc[1][4][4];
      zero(acc);
      warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(acc, s.k, kPitchK, s.k, kPitchK, m0, n0, kHeadDim);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = acc_row(m0, 0, e), col = acc_col(n0, j, e);
          s.l[row * kPitchF + col] = row > col ? s.beta[row] * acc[0][j][e] : 0.f;
        }
    }
    __syncthreads();

    // 2. Diagonal 16x16 blocks: X[i, c] = [i == c] - sum_{c <= j < i} L[i, j] X[j, c].
    if (threadIdx.x < kChunk) {
      const int base = 16 * (threadIdx.x / 16), c = base + threadIdx.x % 16;
      for (int i = base; i < base + 16; ++i) {
        float acc = i == c ? 1.f : 0.f;
        for (int j = c; j < i; ++j) acc -= s.l[i * kPitchF + j] * s.x[j * kPitchF + c];
        s.x[i * kPitchF + c] = i < c ? 0.f : acc;
      }
      for (int i = 0; i < kChunk; ++i)  // zero the strictly-upper off-diagonal blocks of column c
        if (i < base) s.x[i * kPitchF + c] = 0.f;
    }
    __syncthreads();
    // 3. The two 32x32 diagonal blocks (their lower-left 16x16 blocks).
    combine(s, 16, 16);
    combine(s, 48, 16);
    // 4. The lower-left 32x32 block.
    combine(s, 32, 32);

    // Output rows of valid tokens.
    for (int e = threadIdx.x; e < where.rows * kChunk; e += kThreads) {
      const int row = e / kChunk, col = e % kChunk;
      const int64_t token_row = (b * p.seqlen + where.first_token + row) * p.num_v_heads + h;
      static_cast<InverseT*>(p.inverse)[token_row * kChunk + col] =
          static_cast<InverseT>(s.x[row * kPitchF + col]);
    }
  }
};

template <typename Elem, typename InverseT>
__global__ void __launch_bounds__(256) chunk_inverse_kernel(const __grid_constant__ ForwardParams p) {
  ChunkInverse<Elem, InverseT>::run(p);
}

}  // namespace flashgdn::kern
