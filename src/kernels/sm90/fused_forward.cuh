// Fused chunked forward: one CTA walks the chunks of one (sequence, v-head) with the state S in
// fp32 registers, computing W, Vd and O per chunk; W and Vd never leave shared memory.
//
// With chunk_states set (the backward's pre-pass), the bf16 state entering every chunk is saved
// and o may be null.
//
// Grid  (N sequences, Hv); block 256 threads = 8 warps, mma.sync m16n8k16 (bf16/fp16 operands,
// fp32 accumulate). Every 128x128 product uses the warp tiling rows 32*(warp%4), cols 64*(warp/4),
// so each thread holds the same 64 elements of S in `state` for the whole sequence.
//
// Shared memory (Elem = bf16/fp16, rows padded to 136 / 72 elements):
//   kq [128][136]   rows 0-63 K, rows 64-127 Q of the chunk
//   v  [64][136]    V, overwritten in place by W
//   state [128][136]  bf16 copy of S (the B operand of K.S and Q.S)
//   vd, vd_decayed [64][136]   Vd and rho (.) Vd
//   p, ag [64][72]  G (.) QK^T and G (.) A_r (.) 1 beta^T
//   gcum, beta [64] fp32   (gcum in log2 units: every decay factor below is one ex2)
// Per chunk (g = inclusive cumsum of the gates, gamma = g_last, Gamma = diag(e^g),
// rho = e^{gamma - g}, G[s,t] = e^{g_s - g_t} for s >= t):
//   P          [64,64]   = G (.) Q[64,128] @ K^T[128,64]                 all warps, [16,32] tiles
//   Ag         [64,64]   = G (.) A_r (.) 1 beta^T                        elementwise, A_r from HBM
//   [U; QS]    [128,128] = [K; Q][128,128] @ S[128,128]                  all warps
//   W          [64,128]  = V - Gamma U                                   warps 0,1,4,5
//   Vd         [64,128]  = Ag[64,64] @ W[64,128]                         warps 0,1,4,5
//   O          [64,128]  = scale (Gamma QS + P[64,64] @ Vd[64,128])      warps 2,3,6,7
//   S          [128,128] = e^gamma S + K^T[128,64] @ (rho (.) Vd)[64,128] all warps
#pragma once

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

template <typename Elem, typename InverseT>
struct FusedForward {
  static constexpr int kThreads = 256;
  static constexpr int kPitch = kHeadDim + 8;  // elements per row of a 128-wide tile
  static constexpr int kPitchC = kChunk + 8;   // elements per row of a 64-wide tile

  struct SharedStorage {
    alignas(16) Elem kq[2 * kChunk * kPitch];
    alignas(16) Elem v[kChunk * kPitch];
    alignas(16) Elem state[kHeadDim * kPitch];
    alignas(16) Elem vd[kChunk * kPitch];
    alignas(16) Elem vd_decayed[kChunk * kPitch];
    alignas(16) Elem p[kChunk * kPitchC];
    alignas(16) Elem ag[kChunk * kPitchC];
    float gcum[kChunk];
    float beta[kChunk];
  };

  using StateTile = float[2][8][4];

  // Offset of state element (row k, col v) of (sequence n, head h) in a states tensor.
  static __device__ int64_t state_offset(const int64_t (&strides)[4], bool vk, int64_t n, int h,
                                         int k, int v) {
    return n * strides[0] + h * strides[1] + (vk ? v * strides[2] + k * strides[3]
                                                 : k * strides[2] + v * strides[3]);
  }

  static __device__ void store_state_copy(SharedStorage& s, const StateTile& state, int m0, int n0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          store_pair(&s.state[acc_row(m0, i, e) * kPitch + acc_col(n0, j, e)], state[i][j][e],
                     state[i][j][e + 1]);
  }

  // The bf16 copy of the state entering chunk c (complete since the loop's first barrier) into
  // chunk_states, 16-byte vectors.
  static __device__ void save_entering_state(const ForwardParams& p, const SharedStorage& s, int64_t n, int h,
                                             int64_t c) {
    Elem* dst = static_cast<Elem*>(p.chunk_states) +
                ((first_chunk(p, n) + c) * p.num_v_heads + h) * (kHeadDim * kHeadDim);
    for (int e = threadIdx.x; e < kHeadDim * 16; e += kThreads) {
      const int row = e / 16, vec = e % 16;
      *reinterpret_cast<uint4*>(dst + row * kHeadDim + vec * 8) =
          *reinterpret_cast<const uint4*>(&s.state[row * kPitch + vec * 8]);
    }
  }

  // K and Q rows of the chunk into kq, V rows into v; rows past the chunk are zero-filled.
  static __device__ void load_chunk(const ForwardParams& p, SharedStorage& s, int64_t b,
                                    int64_t t0, int rows, int hk, int h) {
    for (int e = threadIdx.x; e < 3 * kChunk * 16; e += kThreads) {
      const int tile = e / (kChunk * 16), row = (e / 16) % kChunk, vec = e % 16;
      const bool valid = row < rows;
      const int64_t t = valid ? t0 + row : t0;
      const Elem* src = tile == 0   ? row_ptr<Elem>(p.k, p.k_strides, b, t, hk)
                        : tile == 1 ? row_ptr<Elem>(p.q, p.q_strides, b, t, hk)
                                    : row_ptr<Elem>(p.v, p.v_strides, b, t, h);
      Elem* dst = tile < 2 ? &s.kq[(tile * kChunk + row) * kPitch] : &s.v[row * kPitch];
      cp_async_16(dst + vec * 8, src + vec * 8, valid);
    }
    cp_async_commit();
  }

  // P = G (.) QK^T (lower triangle with diagonal) and Ag = G (.) A_r (.) 1 beta^T.
  static __device__ void gated_chunk_matrices(const ForwardParams& p, SharedStorage& s, int64_t b,
                                              int64_t t0, int rows, int h) {
    const int warp = threadIdx.x / 32;
    const int pm0 = 16 * (warp % 4), pn0 = 32 * (warp / 4);
    float qk[1][4][4];
    zero(qk);
    warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(qk, s.kq + kChunk * kPitch, kPitch, s.kq,
                                                            kPitch, pm0, pn0, kHeadDim);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int row = acc_row(pm0, 0, e), col = acc_col(pn0, j, e);
        float gated[2];
#pragma unroll
        for (int d = 0; d < 2; ++d)
          gated[d] = row >= col + d ? exp2_approx(s.gcum[row] - s.gcum[col + d]) * qk[0][j][e + d] : 0.f;
        store_pair(&s.p[row * kPitchC + col], gated[0], gated[1]);
      }

    const int row = threadIdx.x / 4, col0 = 16 * (threadIdx.x % 4);
    const InverseT* inverse_row = static_cast<const InverseT*>(p.inverse) +
                                  ((b * p.seqlen + t0 + row) * p.num_v_heads + h) * kChunk;
#pragma unroll
    for (int c = 0; c < 16; c += 2) {
      float gated[2];
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int col = col0 + c + d;
        gated[d] = row < rows && row >= col
                       ? exp2_approx(s.gcum[row] - s.gcum[col]) * to_float(inverse_row[col]) * s.beta[col]
                       : 0.f;
      }
      store_pair(&s.ag[row * kPitchC + col0 + c], gated[0], gated[1]);
    }
  }

  static __device__ void run(const ForwardParams& p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int64_t n = blockIdx.x;
    const int h = blockIdx.y;
    const int hk = h / (p.num_v_heads / p.num_qk_heads);
    const SequenceBounds seq = sequence_bounds(p, n);
    const int64_t b = seq.batch;
    const int warp = threadIdx.x / 32;
    const int m0 = 32 * (warp % 4), n0 = 64 * (warp / 4);
    const bool u_warp = warp % 4 < 2;  // rows 0-63 of [U; QS] (U), else rows 64-127 (QS)

    float state[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          state[i][j][e] = p.initial_state == nullptr
                               ? 0.f
                               : p.initial_state[state_offset(p.initial_state_strides, p.state_vk, n, h,
                                                              acc_row(m0, i, e), acc_col(n0, j, e))];
    store_state_copy(s, state, m0, n0);

    const int64_t num_chunks = (seq.eos - seq.bos + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t t0 = seq.bos + c * kChunk;
      const int rows = static_cast<int>(seq.eos - t0 < kChunk ? seq.eos - t0 : kChunk);
      __syncthreads();  // the previous chunk is done with every buffer
      load_chunk(p, s, b, t0, rows, hk, h);
      if (threadIdx.x < 32) load_chunk_gates(p, s.gcum, s.beta, b, t0, rows, h);
      if (p.chunk_states != nullptr) save_entering_state(p, s, n, h, c);
      cp_async_wait<0>();
      __syncthreads();
      const float gamma = s.gcum[kChunk - 1];

      gated_chunk_matrices(p, s, b, t0, rows, h);

      float acc[2][8][4];
      zero(acc);
      warp_gemm<2, 8, Stored::kRowMajor, Stored::kRowMajor>(acc, s.kq, kPitch, s.state, kPitch, m0, n0,
                                                            kHeadDim);
      // W = V - Gamma U (U warps, in place over V); Gamma QS stays in the QS warps' registers.
      // A thread's accumulator rows are m0 + 16 i + lane/4 (+ 8): one decay factor per (i, half).
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = acc_row(m0, i, 2 * half);
          const float decay = exp2_approx(s.gcum[u_warp ? row : row - kChunk]);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int e = 2 * half, col = acc_col(n0, j, e);
            if (u_warp) {
              Elem* w = &s.v[row * kPitch + col];
              store_pair(w, to_float(w[0]) - decay * acc[i][j][e], to_float(w[1]) - decay * acc[i][j][e + 1]);
            } else {
              acc[i][j][e] *= decay;
              acc[i][j][e + 1] *= decay;
            }
          }
        }
      __syncthreads();  // W and P, Ag complete

      if (u_warp) {  // Vd = Ag @ W, rows m0..m0+31 (acc is free again: U was consumed by W)
        zero(acc);
        warp_gemm<2, 8, Stored::kRowMajor, Stored::kRowMajor>(acc, s.ag, kPitchC, s.v, kPitch, m0, n0, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = acc_row(m0, i, 2 * half);
            const float rho = exp2_approx(gamma - s.gcum[row]);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const int e = 2 * half, col = acc_col(n0, j, e);
              store_pair(&s.vd[row * kPitch + col], acc[i][j][e], acc[i][j][e + 1]);
              store_pair(&s.vd_decayed[row * kPitch + col], rho * acc[i][j][e], rho * acc[i][j][e + 1]);
            }
          }
      }
      __syncthreads();  // Vd complete

      if (!u_warp) {  // O = scale (Gamma QS + P @ Vd), chunk rows m0-64 ..
        warp_gemm<2, 8, Stored::kRowMajor, Stored::kRowMajor>(acc, s.p, kPitchC, s.vd, kPitch, m0 - kChunk,
                                                              n0, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
              const int row = acc_row(m0 - kChunk, i, e), col = acc_col(n0, j, e);
              if (row < rows && p.o != nullptr) {
                Elem* out = static_cast<Elem*>(p.o) + b * p.o_strides.batch + (t0 + row) * p.o_strides.token +
                            h * p.o_strides.head + col;
                store_pair(out, p.scale * acc[i][j][e], p.scale * acc[i][j][e + 1]);
              }
            }
      }

      // S = e^gamma S + K^T @ (rho (.) Vd)
      const float decay = exp2_approx(gamma);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) state[i][j][e] *= decay;
      warp_gemm<2, 8, Stored::kTransposed, Stored::kRowMajor>(state, s.kq, kPitch, s.vd_decayed, kPitch, m0,
                                                              n0, kChunk);
      store_state_copy(s, state, m0, n0);  // GEMM1 of this chunk read the old copy two barriers ago
    }

    if (p.final_state != nullptr) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            p.final_state[state_offset(p.final_state_strides, p.state_vk, n, h, acc_row(m0, i, e),
                                       acc_col(n0, j, e))] = state[i][j][e];
    }
  }
};

template <typename Elem, typename InverseT>
__global__ void __launch_bounds__(256, 1) fused_forward_kernel(const __grid_constant__ ForwardParams p) {
  FusedForward<Elem, InverseT>::run(p);
}

}  // namespace flashgdn::kern
