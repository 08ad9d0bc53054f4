// Fused chunked forward: one CTA walks the chunks of one (sequence, v-head) with the state S in
// fp32 registers, computing W, Vd and O per chunk; W and Vd never leave shared memory.
//
// o may be null (the CP state pass). With intra-card CP the CTAs are segments instead of sequences, and a CTA's
// tokens, entering state and end state come from work_item() (sequence.cuh; passes in
// cp_kernels.cu).
//
// Grid  (N sequences or segments, Hv * kVSplit[, 2 for the CP state pass]); block 256 threads = 8
// warps, mma.sync m16n8k16 (bf16/fp16 operands, fp32 accumulate). The columns of S evolve
// independently, so with kVSplit = 2 two CTAs share a (sequence, v-head), each owning kCols = 64
// value columns (v0 = 64 * (blockIdx.y % 2)) of S, V, W, Vd and o; both compute P and Ag. Every
// [128, kCols] product uses the warp tiling rows 32*(warp%4), cols (kCols/2)*(warp/4), so each thread
// holds the same 64 / kVSplit elements of S in `state` for the whole sequence.
//
// Shared memory (Elem = bf16/fp16, rows padded by 8 elements; 188.5 KiB, 140.5 KiB with kVSplit 2):
//   kq [2][128][136]   rows 0-63 K, rows 64-127 Q of the chunk; two buffers: chunk c+1's cp.async
//                      loads run during chunk c
//   v  [2][64][kCols + 8]   this CTA's V columns, overwritten in place by W
//   state [128][kCols + 8]  bf16 copy of S (the B operand of K.S and Q.S)
//   vd, vd_decayed [64][kCols + 8]   Vd and rho (.) Vd
//   p, ag [64][72]  G (.) QK^T and G (.) A_r (.) 1 beta^T
//   gcum, beta [64] fp32   (gcum in log2 units: every decay factor below is one ex2)
// Per chunk (g = inclusive cumsum of the gates, gamma = g_last, Gamma = diag(e^g),
// rho = e^{gamma - g}, G[s,t] = e^{g_s - g_t} for s >= t):
//   P          [64,64]   = G (.) Q[64,128] @ K^T[128,64]                 all warps, [16,32] tiles
//   Ag         [64,64]   = G (.) A_r (.) 1 beta^T                        elementwise, A_r from HBM
//   [U; QS]    [128,C]   = [K; Q][128,128] @ S[128,C]                    all warps   (C = kCols)
//   W          [64,C]    = V - Gamma U                                   warps 0,1,4,5
//   Vd         [64,C]    = Ag[64,64] @ W[64,C]                           warps 0,1,4,5
//   O          [64,C]    = scale (Gamma QS + P[64,64] @ Vd[64,C])        warps 2,3,6,7
//   S          [128,C]   = e^gamma S + K^T[128,64] @ (rho (.) Vd)[64,C]  all warps
#pragma once

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

template <typename Elem, typename InverseT, int kVSplit>
struct FusedForward {
  static constexpr int kThreads = 256;
  static constexpr int kPitch = kHeadDim + 8;  // elements per row of a 128-wide tile
  static constexpr int kPitchC = kChunk + 8;   // elements per row of a 64-wide tile
  // Value columns of this CTA: S's columns evolve independently, so kVSplit CTAs share a (sequence,
  // v-head), each with kCols columns of S, V, W, Vd and o (P and Ag are computed by each).
  static constexpr int kCols = kHeadDim / kVSplit;
  static constexpr int kPitchV = kCols + 8;
  static constexpr int kNT = kCols / 16;  // 8-column fragments per warp (two warp columns of kCols / 2)

  struct SharedStorage {
    alignas(16) Elem kq[2][2 * kChunk * kPitch];  // double-buffered: chunk c+1 loads during chunk c
    alignas(16) Elem v[2][kChunk * kPitchV];
    alignas(16) Elem state[kHeadDim * kPitchV];
    alignas(16) Elem vd[kChunk * kPitchV];
    alignas(16) Elem vd_decayed[kChunk * kPitchV];
    alignas(16) Elem p[kChunk * kPitchC];
    alignas(16) Elem ag[kChunk * kPitchC];
    float gcum[kChunk];
    float beta[kChunk];
  };

  using StateTile = float[2][kNT][4];

  static __device__ void store_state_copy(SharedStorage& s, const StateTile& state, int m0, int n0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          store_pair(&s.state[acc_row(m0, i, e) * kPitchV + acc_col(n0, j, e)], state[i][j][e],
                     state[i][j][e + 1]);
  }

  // K and Q rows of the chunk into kq, V rows into v; rows past the chunk (and V when zero_v)
  // are zero-filled.
  static __device__ void load_chunk(const ForwardParams& p, SharedStorage& s, int64_t b,
                                    int64_t t0, int rows, int hk, int h, bool zero_v, int buf, int v0) {
    for (int e = threadIdx.x; e < 2 * kChunk * 16; e += kThreads) {  // K and Q rows
      const int tile = e / (kChunk * 16), row = (e / 16) % kChunk, vec = e % 16;
      const bool valid = row < rows;
      const int64_t t = valid ? t0 + row : t0;
      const Elem* src = tile == 0 ? row_ptr<Elem>(p.k, p.k_strides, b, t, hk) : row_ptr<Elem>(p.q, p.q_strides, b, t, hk);
      cp_async_16(&s.kq[buf][(tile * kChunk + row) * kPitch] + vec * 8, src + vec * 8, valid);
    }
    constexpr int kVecs = kCols / 8;
    for (int e = threadIdx.x; e < kChunk * kVecs; e += kThreads) {  // this CTA's V columns
      const int row = e / kVecs, vec = e % kVecs;
      const bool valid = row < rows && !zero_v;
      const Elem* src = row_ptr<Elem>(p.v, p.v_strides, b, valid ? t0 + row : t0, h) + v0;
      cp_async_16(&s.v[buf][row * kPitchV] + vec * 8, src + vec * 8, valid);
    }
    cp_async_commit();
  }

  // P = G (.) QK^T (lower triangle with diagonal) and Ag = G (.) A_r (.) 1 beta^T.
  static __device__ void gated_chunk_matrices(const ForwardParams& p, SharedStorage& s, const Elem* kq,
                                              int64_t b, int64_t t0, int rows, int h) {
    const int warp = threadIdx.x / 32;
    const int pm0 = 16 * (warp % 4), pn0 = 32 * (warp / 4);
    float qk[1][4][4];
    zero(qk);
    warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(qk, kq + kChunk * kPitch, kPitch, kq,
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
    const int h = blockIdx.y / kVSplit;
    const int v0 = kCols * static_cast<int>(blockIdx.y % kVSplit);  // first value column of this CTA
    const WorkItem item = work_item(p, blockIdx.x, h, blockIdx.z);
    if (!item.valid) return;
    const int hk = h / (p.num_v_heads / p.num_qk_heads);
    const int64_t b = item.batch;
    const int warp = threadIdx.x / 32;
    const int m0 = 32 * (warp % 4), n0 = (kCols / 2) * (warp / 4);
    const bool u_warp = warp % 4 < 2;  // rows 0-63 of [U; QS] (U), else rows 64-127 (QS)

    float state[2][kNT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = acc_row(m0, i, e), col = v0 + acc_col(n0, j, e);
          state[i][j][e] = item.initial_identity     ? (row == col ? 1.f : 0.f)
                           : item.initial.base == nullptr ? 0.f
                                                          : item.initial.load(row, col);
        }
    store_state_copy(s, state, m0, n0);

    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    auto chunk_rows = [&](int64_t c) {
      const int64_t left = item.eos - (item.bos + c * kChunk);
      return static_cast<int>(left < kChunk ? left : kChunk);
    };
    if (num_chunks > 0) load_chunk(p, s, b, item.bos, chunk_rows(0), hk, h, item.zero_v, 0, v0);
    ChunkGates gates;  // warp 0: the gates of the chunk about to run
    if (warp == 0 && num_chunks > 0) gates = fetch_chunk_gates(p, b, item.bos, chunk_rows(0), h);
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t t0 = item.bos + c * kChunk;
      const int rows = chunk_rows(c);
      const int buf = static_cast<int>(c & 1);
      Elem* const kq = s.kq[buf];
      Elem* const v = s.v[buf];
      __syncthreads();  // chunk c-1 is done with every buffer, including kq/v[buf ^ 1] refilled now
      if (c + 1 < num_chunks) {
        load_chunk(p, s, b, t0 + kChunk, chunk_rows(c + 1), hk, h, item.zero_v, buf ^ 1, v0);
        cp_async_wait<1>();  // this chunk's group has landed; the next one's may be in flight
      } else {
        cp_async_wait<0>();
      }
      if (warp == 0) {
        store_chunk_gates(s.gcum, s.beta, gates);
        if (c + 1 < num_chunks) gates = fetch_chunk_gates(p, b, t0 + kChunk, chunk_rows(c + 1), h);
      }
      __syncthreads();
      const float gamma = s.gcum[kChunk - 1];

      gated_chunk_matrices(p, s, kq, b, t0, rows, h);

      float acc[2][kNT][4];
      zero(acc);
      warp_gemm<2, kNT, Stored::kRowMajor, Stored::kRowMajor>(acc, kq, kPitch, s.state, kPitchV, m0, n0,
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
          for (int j = 0; j < kNT; ++j) {
            const int e = 2 * half, col = acc_col(n0, j, e);
            if (u_warp) {
              Elem* w = &v[row * kPitchV + col];
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
        warp_gemm<2, kNT, Stored::kRowMajor, Stored::kRowMajor>(acc, s.ag, kPitchC, v, kPitchV, m0, n0, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = acc_row(m0, i, 2 * half);
            const float rho = exp2_approx(gamma - s.gcum[row]);
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
              const int e = 2 * half, col = acc_col(n0, j, e);
              store_pair(&s.vd[row * kPitchV + col], acc[i][j][e], acc[i][j][e + 1]);
              store_pair(&s.vd_decayed[row * kPitchV + col], rho * acc[i][j][e], rho * acc[i][j][e + 1]);
            }
          }
      }
      __syncthreads();  // Vd complete

      if (!u_warp) {  // O = scale (Gamma QS + P @ Vd), chunk rows m0-64 ..
        warp_gemm<2, kNT, Stored::kRowMajor, Stored::kRowMajor>(acc, s.p, kPitchC, s.vd, kPitchV, m0 - kChunk,
                                                                n0, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
              const int row = acc_row(m0 - kChunk, i, e), col = acc_col(n0, j, e);
              if (row < rows && item.write_o) {
                Elem* out = static_cast<Elem*>(p.o) + b * p.o_strides.batch + (t0 + row) * p.o_strides.token +
                            h * p.o_strides.head + v0 + col;
                store_pair(out, p.scale * acc[i][j][e], p.scale * acc[i][j][e + 1]);
              }
            }
      }

      // S = e^gamma S + K^T @ (rho (.) Vd)
      const float decay = exp2_approx(gamma);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) state[i][j][e] *= decay;
      warp_gemm<2, kNT, Stored::kTransposed, Stored::kRowMajor>(state, kq, kPitch, s.vd_decayed, kPitchV, m0,
                                                                n0, kChunk);
      store_state_copy(s, state, m0, n0);  // GEMM1 of this chunk read the old copy two barriers ago
      if (item.write_checkpoints && rows == kChunk && (item.chunks_before + c + 1) % p.checkpoint_chunks == 0) {
        StateBlock out = checkpoint_state(p, item.sequence, (item.chunks_before + c + 1) / p.checkpoint_chunks - 1, h);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) out.store(acc_row(m0, i, e), v0 + acc_col(n0, j, e), state[i][j][e]);
      }
    }

    if (item.final.base != nullptr) {
      StateBlock final = item.final;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) final.store(acc_row(m0, i, e), v0 + acc_col(n0, j, e), state[i][j][e]);
    }
  }
};

template <typename Elem, typename InverseT, int kVSplit>
__global__ void __launch_bounds__(256, 1) fused_forward_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  FusedForward<Elem, InverseT, kVSplit>::run(p);
}

}  // namespace flashgdn::kern
