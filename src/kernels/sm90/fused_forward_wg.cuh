// Fused chunked forward on warpgroup MMAs (sm_90a wgmma): the same work items, math and outputs as
// fused_forward.cuh (its header has the per-chunk algebra), with every product a wgmma reading
// 128-byte-swizzled shared-memory tiles (wgmma.cuh) instead of mma.sync on padded tiles.
//
// Grid (N sequences or segments, Hv[, 2 for the CP state pass]); block 256 threads = 2 warpgroups.
// Accumulators follow the m64nN layout of wgmma.cuh: warp w of a group holds rows 16 w + lane / 4
// (+ 8) of the group's 64 rows, all N columns.
//   group 0 (warps 0-3): U = K S, Ag (while U runs), W = V - Gamma U, Vd = Ag W, rho Vd;
//                        state rows 0-63
//   group 1 (warps 4-7): QS = Q S and P = G (.) Q K^T, then O = scale (Gamma QS + P Vd);
//                        state rows 64-127
// Each thread keeps 64 fp32 elements of S (its group's 64 rows, all 128 value columns) in
// registers for the whole sequence; S is the accumulator of its own update.
//
// Shared memory (all tiles 1024-byte aligned, 128B-swizzled panels of 64 elements; 176.5 KiB):
//   k, q [2][64 tokens][128]    K and Q of the chunk (two buffers: chunk c+1 loads during chunk c).
//                               One layout serves K as the K-major A of K S, the K-major B of
//                               Q K^T and the MN-major A (K^T) of the state update.
//   v [2][64 tokens][128]       V, overwritten in place by W (the MN-major B of Ag W)
//   state [128][128]            bf16 copy of S, [K row][V column] (the MN-major B of K S and Q S)
//   vd, vd_decayed [64][128]    Vd (B of P Vd) and rho (.) Vd (B of the update)
//   p, ag [64][64]              the K-major A operands of P Vd and Ag W
//   gcum, beta [64] fp32        gcum in log2 units
// Per chunk (4 barriers):
//   top       wait for the chunk's loads, issue chunk c+1's, gates -> gcum/beta
//   phase 1   g0: U [64,128] = K[64,128] @ S[128,128]; Ag [64,64] = G (.) A_r (.) 1 beta^T under it;
//                 W = V - Gamma U
//             g1: QS [64,128] = Q[64,128] @ S[128,128], QK [64,64] = Q @ K^T; P = G (.) QK (lower)
//   phase 2   g0: Vd [64,128] = Ag[64,64] @ W[64,128] -> vd, rho (.) Vd -> vd_decayed
//   phase 3   g1: O [64,128] = scale (Gamma QS + P[64,64] @ Vd[64,128]) -> o
//             both: S[64g.., :] = e^gamma S + K^T[64g.., 64] @ (rho (.) Vd)[64,128]; bf16 copy -> state
#pragma once

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace flashgdn::kern {

template <typename Elem, typename InverseT>
struct FusedForwardWg {
  static constexpr int kThreads = 256;
  static constexpr int kTokenTileBytes = kChunk * kHeadDim * 2;   // [64][128]
  static constexpr int kStateTileBytes = kHeadDim * kHeadDim * 2;  // [128][128]
  static constexpr int kSquareTileBytes = kChunk * kChunk * 2;     // [64][64]
  static constexpr int kPanelBytes = kChunk * 128;                 // 64 rows of one 64-element panel
  using Major = wg::Major;

  struct SharedStorage {
    alignas(1024) unsigned char k[2][kTokenTileBytes];
    alignas(1024) unsigned char q[2][kTokenTileBytes];
    alignas(1024) unsigned char v[2][kTokenTileBytes];
    alignas(1024) unsigned char state[kStateTileBytes];
    alignas(1024) unsigned char vd[kTokenTileBytes];
    alignas(1024) unsigned char vd_decayed[kTokenTileBytes];
    alignas(1024) unsigned char p[kSquareTileBytes];
    alignas(1024) unsigned char ag[kSquareTileBytes];
    float gcum[kChunk];
    float beta[kChunk];
  };

  static __device__ __forceinline__ Elem* element(unsigned char* tile, uint32_t offset) {
    return reinterpret_cast<Elem*>(tile + offset);
  }

  // Accumulator coordinates (wgmma.cuh): element 4 j + e of this thread in its group's tile.
  static __device__ __forceinline__ int acc_row(int e) {
    return 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4 + 8 * (e / 2);
  }
  static __device__ __forceinline__ int acc_col(int j, int e) { return 8 * j + 2 * (threadIdx.x % 4) + e % 2; }

  // K and Q rows of the chunk, and V (zeros when zero_v), into buffer `buf`; rows past the chunk
  // are zero-filled.
  static __device__ void load_chunk(const ForwardParams& p, SharedStorage& s, int64_t b, int64_t t0, int rows, int hk,
                                    int h, bool zero_v, int buf) {
    for (int e = threadIdx.x; e < 3 * kChunk * 16; e += kThreads) {
      const int tile = e / (kChunk * 16), row = (e / 16) % kChunk, vec = e % 16;
      const bool in_chunk = row < rows;
      const int64_t t = in_chunk ? t0 + row : t0;
      const Elem* src = tile == 0   ? row_ptr<Elem>(p.k, p.k_strides, b, t, hk)
                        : tile == 1 ? row_ptr<Elem>(p.q, p.q_strides, b, t, hk)
                                    : row_ptr<Elem>(p.v, p.v_strides, b, t, h);
      unsigned char* dst = tile == 0 ? s.k[buf] : tile == 1 ? s.q[buf] : s.v[buf];
      cp_async_16(dst + wg::tile_offset(row, vec * 8, kChunk), src + vec * 8, in_chunk && !(tile == 2 && zero_v));
    }
    cp_async_commit();
  }

  // The bf16 copy of the state entering chunk c into chunk_states, 16-byte vectors (one swizzle
  // unit holds 8 consecutive value columns of a row).
  static __device__ void save_entering_state(const ForwardParams& p, SharedStorage& s, int64_t chunk_id, int h) {
    Elem* dst = static_cast<Elem*>(p.chunk_states) + (chunk_id * p.num_v_heads + h) * (kHeadDim * kHeadDim);
    for (int e = threadIdx.x; e < kHeadDim * 16; e += kThreads) {
      const int row = e / 16, vec = e % 16;
      *reinterpret_cast<uint4*>(dst + row * kHeadDim + vec * 8) =
          *reinterpret_cast<const uint4*>(s.state + wg::tile_offset(row, vec * 8, kHeadDim));
    }
  }

  // This group's 64 state rows (row0 = 64 * group) -> the bf16 copy.
  static __device__ void store_state_copy(SharedStorage& s, const float (&state)[64], int row0) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        store_pair(element(s.state, wg::tile_offset(row0 + acc_row(e), acc_col(j, e), kHeadDim)), state[4 * j + e],
                   state[4 * j + e + 1]);
  }

  // Ag = G (.) A_r (.) 1 beta^T (lower triangle with diagonal, rows past the chunk zero), by the
  // 128 threads of group 0: row = thread / 2, 32 columns each.
  static __device__ void gated_inverse(const ForwardParams& p, SharedStorage& s, int64_t b, int64_t t0, int rows,
                                       int h) {
    const int row = (threadIdx.x % 128) / 2, col0 = 32 * (threadIdx.x % 2);
    const InverseT* inverse_row =
        static_cast<const InverseT*>(p.inverse) + ((b * p.seqlen + t0 + row) * p.num_v_heads + h) * kChunk;
    float a_r[32];
#pragma unroll
    for (int c = 0; c < 32; ++c) a_r[c] = row < rows && row >= col0 + c ? to_float(inverse_row[col0 + c]) : 0.f;
    const float g_row = s.gcum[row];
#pragma unroll
    for (int c = 0; c < 32; c += 2) {
      float gated[2];
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int col = col0 + c + d;
        gated[d] = row >= col ? exp2_approx(g_row - s.gcum[col]) * a_r[c + d] * s.beta[col] : 0.f;
      }
      store_pair(element(s.ag, wg::swizzled_offset(row, col0 + c)), gated[0], gated[1]);
    }
  }

  static __device__ void run(const ForwardParams& p) {
    extern __shared__ __align__(1024) unsigned char smem_wg[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_wg);
    const int h = blockIdx.y;
    const WorkItem item = work_item(p, blockIdx.x, h, blockIdx.z);
    if (!item.valid) return;
    const int hk = h / (p.num_v_heads / p.num_qk_heads);
    const int64_t b = item.batch;
    const int warp = threadIdx.x / 32;
    // Warpgroup index made visibly warp-uniform (a shuffle), so that ptxas does not treat the
    // group branches around the wgmmas as divergent and serialise them.
    const int group = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    const int row0 = 64 * group;  // this group's state rows

    float state[64];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + acc_row(e), col = acc_col(j, e);
        state[4 * j + e] = item.initial_identity       ? (row == col ? 1.f : 0.f)
                           : item.initial.base == nullptr ? 0.f
                                                          : item.initial.load(row, col);
      }
    store_state_copy(s, state, row0);

    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    auto chunk_rows = [&](int64_t c) {
      const int64_t left = item.eos - (item.bos + c * kChunk);
      return static_cast<int>(left < kChunk ? left : kChunk);
    };
    if (num_chunks > 0) load_chunk(p, s, b, item.bos, chunk_rows(0), hk, h, item.zero_v, 0);
    ChunkGates gates;  // warp 0: the gates of the chunk about to run
    if (warp == 0 && num_chunks > 0) gates = fetch_chunk_gates(p, b, item.bos, chunk_rows(0), h);
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t t0 = item.bos + c * kChunk;
      const int rows = chunk_rows(c);
      const int buf = static_cast<int>(c & 1);
      __syncthreads();  // chunk c-1 is done with every buffer, including k/q/v[buf ^ 1] refilled now
      if (c + 1 < num_chunks) {
        load_chunk(p, s, b, t0 + kChunk, chunk_rows(c + 1), hk, h, item.zero_v, buf ^ 1);
        cp_async_wait<1>();  // this chunk's group has landed; the next one's may be in flight
      } else {
        cp_async_wait<0>();
      }
      if (warp == 0) {
        store_chunk_gates(s.gcum, s.beta, gates);
        if (c + 1 < num_chunks) gates = fetch_chunk_gates(p, b, t0 + kChunk, chunk_rows(c + 1), h);
      }
      if (p.chunk_states != nullptr) save_entering_state(p, s, item.first_chunk_id + c, h);
      wg::fence_shared_to_async();  // the landed tiles and the state copy, for the wgmmas below
      __syncthreads();
      const float gamma = s.gcum[kChunk - 1];

      float acc[64];  // g0: U, then Vd; g1: QS, then O
      if (group == 0) {
        wg::fence();
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16)
          wg::mma_ss<Elem, 128, Major::kK, Major::kMN>(acc, wg::descriptor<Major::kK>(s.k[buf], k0, kChunk),
                                                       wg::descriptor<Major::kMN>(s.state, k0, kHeadDim), k0 > 0);
        wg::commit();
        gated_inverse(p, s, b, t0, rows, h);
        wg::wait<0>();
        wg::fence_operand(acc);
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // W = V - Gamma U, in place over V
          const int row = acc_row(2 * half);
          const float decay = exp2_approx(s.gcum[row]);
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            Elem* w = element(s.v[buf], wg::tile_offset(row, acc_col(j, 2 * half), kChunk));
            store_pair(w, to_float(w[0]) - decay * acc[4 * j + 2 * half],
                       to_float(w[1]) - decay * acc[4 * j + 2 * half + 1]);
          }
        }
      } else {
        float qk[32];
        wg::fence();
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16)
          wg::mma_ss<Elem, 128, Major::kK, Major::kMN>(acc, wg::descriptor<Major::kK>(s.q[buf], k0, kChunk),
                                                       wg::descriptor<Major::kMN>(s.state, k0, kHeadDim), k0 > 0);
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16)
          wg::mma_ss<Elem, 64, Major::kK, Major::kK>(qk, wg::descriptor<Major::kK>(s.q[buf], k0, kChunk),
                                                     wg::descriptor<Major::kK>(s.k[buf], k0, kChunk), k0 > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_operand(acc);
        wg::fence_operand(qk);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = acc_row(2 * half);
          const float g_row = s.gcum[row];
          const float decay = exp2_approx(g_row);
#pragma unroll
          for (int j = 0; j < 16; ++j) {  // Gamma QS stays in registers
            acc[4 * j + 2 * half] *= decay;
            acc[4 * j + 2 * half + 1] *= decay;
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) {  // P = G (.) QK^T, lower triangle with diagonal
            const int col = acc_col(j, 2 * half);
            float gated[2];
#pragma unroll
            for (int d = 0; d < 2; ++d)
              gated[d] = row >= col + d ? exp2_approx(g_row - s.gcum[col + d]) * qk[4 * j + 2 * half + d] : 0.f;
            store_pair(element(s.p, wg::swizzled_offset(row, col)), gated[0], gated[1]);
          }
        }
      }
      wg::fence_shared_to_async();  // W, Ag, P
      __syncthreads();

      if (group == 0) {  // Vd = Ag @ W
        wg::fence();
#pragma unroll
        for (int k0 = 0; k0 < kChunk; k0 += 16)
          wg::mma_ss<Elem, 128, Major::kK, Major::kMN>(acc, wg::descriptor<Major::kK>(s.ag, k0, kChunk),
                                                       wg::descriptor<Major::kMN>(s.v[buf], k0, kChunk), k0 > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_operand(acc);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = acc_row(2 * half);
          const float rho = exp2_approx(gamma - s.gcum[row]);
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const uint32_t at = wg::tile_offset(row, acc_col(j, 2 * half), kChunk);
            const float x0 = acc[4 * j + 2 * half], x1 = acc[4 * j + 2 * half + 1];
            store_pair(element(s.vd, at), x0, x1);
            store_pair(element(s.vd_decayed, at), rho * x0, rho * x1);
          }
        }
      }
      wg::fence_shared_to_async();  // Vd, rho Vd
      __syncthreads();

      const float decay = exp2_approx(gamma);
#pragma unroll
      for (int i = 0; i < 64; ++i) state[i] *= decay;
      wg::fence();
      if (group == 1) {  // O = Gamma QS + P @ Vd
#pragma unroll
        for (int k0 = 0; k0 < kChunk; k0 += 16)
          wg::mma_ss<Elem, 128, Major::kK, Major::kMN>(acc, wg::descriptor<Major::kK>(s.p, k0, kChunk),
                                                       wg::descriptor<Major::kMN>(s.vd, k0, kChunk), true);
      }
      // S[row0 .. row0 + 63, :] += K^T[row0 .., 64] @ (rho (.) Vd): panel `group` of the K tile
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 128, Major::kMN, Major::kMN>(
            state, wg::descriptor<Major::kMN>(s.k[buf] + group * kPanelBytes, k0, kChunk),
            wg::descriptor<Major::kMN>(s.vd_decayed, k0, kChunk), true);
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(state);
      wg::fence_operand(acc);
      if (group == 1 && item.write_o) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = acc_row(2 * half);
          if (row < rows) {
            Elem* out = static_cast<Elem*>(p.o) + b * p.o_strides.batch + (t0 + row) * p.o_strides.token +
                        h * p.o_strides.head;
#pragma unroll
            for (int j = 0; j < 16; ++j)
              store_pair(out + acc_col(j, 2 * half), p.scale * acc[4 * j + 2 * half],
                         p.scale * acc[4 * j + 2 * half + 1]);
          }
        }
      }
      store_state_copy(s, state, row0);  // K S and Q S of this chunk read the old copy two barriers ago
      if (item.write_checkpoints && rows == kChunk && (item.chunks_before + c + 1) % p.checkpoint_chunks == 0) {
        StateBlock out = checkpoint_state(p, item.sequence, (item.chunks_before + c + 1) / p.checkpoint_chunks - 1, h);
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) out.store(row0 + acc_row(e), acc_col(j, e), state[4 * j + e]);
      }
    }

    if (item.final.base != nullptr) {
      StateBlock final = item.final;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) final.store(row0 + acc_row(e), acc_col(j, e), state[4 * j + e]);
    }
  }
};

template <typename Elem, typename InverseT>
__global__ void __launch_bounds__(256, 1) fused_forward_wg_kernel(const __grid_constant__ ForwardParams p) {
  FusedForwardWg<Elem, InverseT>::run(p);
}

}  // namespace flashgdn::kern
