// Fused chunked forward on warpgroup MMAs (sm_90a wgmma): the same work items, math and outputs as
// fused_forward.cuh (its header has the per-chunk algebra), with every product a wgmma reading
// 128-byte-swizzled shared-memory tiles (wgmma.cuh) instead of mma.sync on padded tiles.
//
// Grid (N sequences or segments, Hv[, 2 for the CP state pass]); block 256 threads = 2 warpgroups.
// The columns of S evolve independently, so warpgroup g owns value columns 64 g .. 64 g + 63 of S,
// U, QS, W, Vd and O: its chain (K S -> W -> Ag W -> the update) needs no other group's results,
// only the S-independent Ag and P, which the groups make for each other while their first wgmmas
// run (g0: Ag; g1: P = G (.) Q K^T). Accumulators follow the m64nN layout of wgmma.cuh (warp w of a
// group holds rows 16 w + lane / 4 (+ 8)); each thread keeps S[128, its group's 64 columns] as two
// m64n64 fp32 accumulators for the whole sequence, the accumulators of their own update.
//
// Shared memory (tiles 1024-byte aligned, 128B-swizzled panels of 64 elements; 195 KiB with a
// bf16 A_r, 211 KiB with fp32):
//   k, q [2][64 tokens][128]    K and Q of the chunk (two buffers: chunk c+1 loads during chunk c).
//                               One layout serves K as the K-major A of K S, the K-major B of
//                               Q K^T and the MN-major A (K^T) of the update.
//   v [2][64 tokens][128]       V, overwritten in place by W (the MN-major B of Ag W); panel g is
//                               group g's columns, as in every [., 128] tile below
//   inverse [2][64][64 + pad]   A_r rows of the chunk (plain layout, InverseT)
//   state [128][128]            bf16 copy of S (the MN-major B of K S and Q S)
//   vd, vd_decayed [64][128]    Vd (B of P Vd) and rho (.) Vd (B of the update)
//   p, ag [64][64]              the K-major A operands of P Vd and Ag W
//   gcum, beta [2][64] fp32     per buffer; gcum in log2 units
// Per chunk c (barriers: 2 CTA-wide, 1 per group):
//   top       wait for chunk c's loads; gates -> gcum/beta[buf]; CTA barrier; issue chunk c+1's loads
//   phase 1   group g, columns n = 64 g ..:
//               U [64,64] = K[64,128] @ S[128,n],  QS [64,64] = Q[64,128] @ S[128,n]
//               g0 meanwhile: Ag [64,64] = G (.) A_r (.) 1 beta^T;  g1: QK [64,64] = Q @ K^T, P = G (.) QK
//               W[:, n] = V[:, n] - Gamma U;  Gamma QS stays in registers         -> CTA barrier
//   phase 2   Vd [64,64] = Ag[64,64] @ W[64,n] -> vd, rho (.) Vd -> vd_decayed     -> group barrier
//   phase 3   O [64,64] = scale (Gamma QS + P[64,64] @ Vd[64,n]) -> the Vd panel (stmatrix), copied
//             to o in 16-byte rows under chunk c+1's phase-1 wgmmas (the last chunk's after the loop)
//             S[:, n] = e^gamma S[:, n] + K^T[128,64] @ (rho (.) Vd)[64,n];  bf16 copy -> state
// Passes that write no o (the CP state pass) skip QS, Q K^T, P, Vd's plain copy and P Vd.
#pragma once

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/grid_dependency.cuh"
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
  static constexpr int kStatePanelBytes = kHeadDim * 128;          // 128 rows of one panel
  static constexpr int kInversePitch = kChunk + 16 / static_cast<int>(sizeof(InverseT));  // + one 16-byte unit
  static constexpr int kInverseVecs = kChunk * static_cast<int>(sizeof(InverseT)) / 16;   // 16-byte units per row
  static constexpr int kElemsPerVec = 16 / static_cast<int>(sizeof(InverseT));
  using Major = wg::Major;
  using Acc = float[32];  // m64n64 accumulator

  struct SharedStorage {
    alignas(1024) unsigned char k[2][kTokenTileBytes];
    alignas(1024) unsigned char q[2][kTokenTileBytes];
    alignas(1024) unsigned char v[2][kTokenTileBytes];
    alignas(1024) unsigned char state[kStateTileBytes];
    alignas(1024) unsigned char vd[kTokenTileBytes];
    alignas(1024) unsigned char vd_decayed[kTokenTileBytes];
    alignas(1024) unsigned char p[kSquareTileBytes];
    alignas(1024) unsigned char ag[kSquareTileBytes];
    alignas(16) InverseT inverse[2][kChunk * kInversePitch];
    alignas(16) float gcum[2][kChunk];
    alignas(16) float beta[2][kChunk];
  };

  static __device__ __forceinline__ Elem* element(unsigned char* tile, uint32_t offset) {
    return reinterpret_cast<Elem*>(tile + offset);
  }

  // Accumulator coordinates (wgmma.cuh): element 4 j + e of this thread in its group's m64 tile.
  static __device__ __forceinline__ int acc_row(int e) {
    return 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4 + 8 * (e / 2);
  }
  static __device__ __forceinline__ int acc_col(int j, int e) { return 8 * j + 2 * (threadIdx.x % 4) + e % 2; }

  // Barrier of the 128 threads of one warpgroup (ids 1 and 2; 0 is __syncthreads).
  static __device__ __forceinline__ void group_barrier(int group) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
  }

  // K and Q (only with_o) rows of the chunk, V (zeros when zero_v) and the A_r rows into buffer
  // `buf`; rows past the chunk are zero-filled. Thread t copies 16-byte vector t % 16 of rows t / 16 + 16 j of the
  // K, Q and V tiles (one swizzled offset for the three) and its share of the A_r rows; sources are
  // the chunk's first row (CTA-uniform) plus row * token stride.
  static __device__ void load_chunk(const ForwardParams& p, SharedStorage& s, int64_t b, int64_t t0, int rows, int hk,
                                    int h, bool zero_v, bool with_o, int buf) {
    const int vec = threadIdx.x % 16;
    const Elem* k_rows = row_ptr<Elem>(p.k, p.k_strides, b, t0, hk) + vec * 8;
    const Elem* q_rows = row_ptr<Elem>(p.q, p.q_strides, b, t0, hk) + vec * 8;
    const Elem* v_rows = row_ptr<Elem>(p.v, p.v_strides, b, t0, h) + vec * 8;
#pragma unroll 1
    for (int row = threadIdx.x / 16; row < kChunk; row += kThreads / 16) {
      const bool in_chunk = row < rows;
      const int64_t src_row = in_chunk ? row : 0;
      const uint32_t at = wg::tile_offset(row, vec * 8, kChunk);
      cp_async_16(s.k[buf] + at, k_rows + src_row * p.k_strides.token, in_chunk);
      if (with_o) cp_async_16(s.q[buf] + at, q_rows + src_row * p.q_strides.token, in_chunk);
      cp_async_16(s.v[buf] + at, v_rows + src_row * p.v_strides.token, in_chunk && !zero_v);
    }
    const int inverse_vec = threadIdx.x % kInverseVecs;
    const InverseT* inverse_rows = static_cast<const InverseT*>(p.inverse) +
                                   ((b * p.seqlen + t0) * p.num_v_heads + h) * kChunk + inverse_vec * kElemsPerVec;
#pragma unroll 1
    for (int row = threadIdx.x / kInverseVecs; row < kChunk; row += kThreads / kInverseVecs) {
      const bool in_chunk = row < rows;
      const int64_t src_row = in_chunk ? row : 0;
      cp_async_16(&s.inverse[buf][row * kInversePitch + inverse_vec * kElemsPerVec],
                  inverse_rows + src_row * p.num_v_heads * kChunk, in_chunk);
    }
    cp_async_commit();
  }

  // This lane's row address for x4 matrix transfers (stmatrix_x4 / ldmatrix_x4) of columns
  // 8 j .. 8 j + 15 of the warp's 16 accumulator rows (row0 + 16 w ..) of a 128B-swizzled panel:
  // matrix m = lane / 8 is (row half m % 2, column block j + m / 2), and the lane gives its row lane % 8.
  static __device__ __forceinline__ unsigned char* fragment_rows(unsigned char* panel, int row0, int j) {
    const int lane = threadIdx.x % 32, m = lane / 8;
    return panel +
           wg::swizzled_offset(row0 + 16 * ((threadIdx.x / 32) % 4) + 8 * (m % 2) + lane % 8, 8 * (j + m / 2));
  }

  // A [64, 64] accumulator tile (element 4 j + e = value(j, e)) -> Elem tile rows row0 .. of a
  // panel, by four stmatrix_x4: matrix (row half h, column block jj) is elements 4 jj + 2 h (+ 1).
  template <typename F>
  static __device__ __forceinline__ void store_fragments(unsigned char* panel, int row0, F&& value) {
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      uint32_t regs[4];
      pack_x4(regs, j, value);
      stmatrix_x4(fragment_rows(panel, row0, j), regs);
    }
  }
  // The registers of one stmatrix_x4 at column blocks j, j + 1 (j even) of an accumulator
  // (element 4 jj + e = value(jj, e)): matrix m holds elements 4 (j + m / 2) + 2 (m % 2) (+ 1).
  template <typename F>
  static __device__ __forceinline__ void pack_x4(uint32_t (&regs)[4], int j, F&& value) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int jj = j + m / 2, e = 2 * (m % 2);
      regs[m] = pack_pair<Elem>(value(jj, e), value(jj, e + 1));
    }
  }

  // An m64nN accumulator (element 4 j + e = value(j, e)) transposed -> Elem rows row0 .. row0 + N - 1
  // of a panel (accumulator column c to row row0 + c, accumulator row r to column r), by
  // stmatrix_x4.trans: matrix m of a call holds column block j + m / 2 of row band 16 w + 8 (m % 2)
  // (w: the warp in its group).
  template <int kN, typename F>
  static __device__ __forceinline__ void store_transposed(unsigned char* panel, int row0, F&& value) {
    const int lane = threadIdx.x % 32, m = lane / 8, band = 16 * ((threadIdx.x / 32) % 4);
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      uint32_t regs[4];
      pack_x4(regs, j, value);
      stmatrix_x4_trans(panel + wg::swizzled_offset(row0 + 8 * (j + m / 2) + lane % 8, band + 8 * (m % 2)), regs);
    }
  }

  // Columns col0 .. col0 + 63 of the state entering the item: the identity (a CP transition), zero,
  // or the given initial state.
  static __device__ void load_initial_state(const WorkItem& item, int col0, Acc (&state)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = 64 * i + acc_row(e), col = col0 + acc_col(j, e);
          state[i][4 * j + e] = item.initial_identity       ? (row == col ? 1.f : 0.f)
                                : item.initial.base == nullptr ? 0.f
                                                               : item.initial.load(row, col);
        }
  }

  // Columns col0 .. col0 + 63 of S -> a fp32 state (a checkpoint or the final state).
  static __device__ void store_state(const StateBlock& out, int col0, const Acc (&state)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) out.store(64 * i + acc_row(e), col0 + acc_col(j, e), state[i][4 * j + e]);
  }

  // The checkpoint after chunk c of the item (a full chunk ending a checkpoint interval).
  static __device__ void store_checkpoint(const ForwardParams& p, const WorkItem& item, int64_t c, int rows, int h,
                                          int col0, const Acc (&state)[2]) {
    if (item.write_checkpoints && rows == kChunk && (item.chunks_before + c + 1) % p.checkpoint_chunks == 0)
      store_state(checkpoint_state(p, item.sequence, (item.chunks_before + c + 1) / p.checkpoint_chunks - 1, h), col0,
                  state);
  }

  // This group's columns of S (rows 64 i + acc rows) -> the bf16 copy (panel `group`).
  static __device__ void store_state_copy(SharedStorage& s, const Acc (&state)[2], int group) {
    unsigned char* panel = s.state + group * kStatePanelBytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) store_fragments(panel, 64 * i, [&](int j, int e) { return state[i][4 * j + e]; });
  }

  // Rows t0 .. t0 + rows - 1 of this group's 64 o columns, from the group's Vd panel (where phase 3
  // left them by store_fragments) to o in 16-byte vectors (o's rows are 16-byte aligned:
  // api/validate.cpp). Thread t of the group copies vectors t, t + 128, ... (row v / 8, columns
  // 8 (v % 8) ..): a warp writes four whole 128-byte row segments per step.
  static __device__ void copy_out(const ForwardParams& p, const unsigned char* panel, int64_t b, int64_t t0, int rows,
                                  int h, int col0) {
    copy_rows(static_cast<Elem*>(p.o) + b * p.o_strides.batch + t0 * p.o_strides.token + h * p.o_strides.head + col0,
              p.o_strides.token, panel, rows);
  }
  // Rows 0 .. rows - 1 of a [64][64] panel to `out` (rows `row_stride` elements apart, 16-byte
  // aligned), as copy_out.
  static __device__ __forceinline__ void copy_rows(Elem* out, int64_t row_stride, const unsigned char* panel, int rows) {
#pragma unroll
    for (int i = 0; i < kChunk * 8 / 128; ++i) {
      const int v = threadIdx.x % 128 + 128 * i, row = v / 8, vec = v % 8;
      if (row < rows)
        *reinterpret_cast<uint4*>(out + row * row_stride + vec * 8) =
            *reinterpret_cast<const uint4*>(panel + wg::swizzled_offset(row, vec * 8));
    }
  }

  // Phase 3's wgmmas, one commit group: S = e^gamma S + K^T @ (rho Vd) (panel i of the K tile is
  // K^T's rows 64 i ..) and, with o, O += P @ Vd, from this group's Vd and rho Vd panels.
  static __device__ __forceinline__ void issue_output_and_update(Acc (&state)[2], Acc& o, float gamma, bool with_o,
                                                                 const unsigned char* p_tile,
                                                                 const unsigned char* k_tile,
                                                                 const unsigned char* vd_panel,
                                                                 const unsigned char* vd_decayed_panel) {
    const float decay = exp2_approx(gamma);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int x = 0; x < 32; ++x) state[i][x] *= decay;
    wg::fence();
    if (with_o) {
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(o, wg::descriptor<Major::kK>(p_tile, k0, kChunk),
                                                    wg::descriptor<Major::kMN>(vd_panel, k0, kChunk), true);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 64, Major::kMN, Major::kMN>(state[i],
                                                     wg::descriptor<Major::kMN>(k_tile + i * kPanelBytes, k0, kChunk),
                                                     wg::descriptor<Major::kMN>(vd_decayed_panel, k0, kChunk), true);
    wg::commit();
  }

  // Ag = G (.) A_r (.) 1 beta^T (lower triangle with diagonal, rows past the chunk zero), by the
  // 128 threads of group 0: row = thread / 2, 32 columns each, A_r from shared memory.
  static __device__ void gated_inverse(SharedStorage& s, int buf, int rows) {
    const int row = (threadIdx.x % 128) / 2, col0 = 32 * (threadIdx.x % 2);
    float a_r[32];
    const InverseT* src = &s.inverse[buf][row * kInversePitch + col0];
#pragma unroll
    for (int vec = 0; vec < 32 / kElemsPerVec; ++vec) {
      const uint4 bits = *reinterpret_cast<const uint4*>(src + vec * kElemsPerVec);
      const InverseT* x = reinterpret_cast<const InverseT*>(&bits);
#pragma unroll
      for (int i = 0; i < kElemsPerVec; ++i) a_r[vec * kElemsPerVec + i] = to_float(x[i]);
    }
    float g_col[32], beta_col[32];  // 16-byte loads of the 32 columns' gates and betas
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      const float4 g4 = *reinterpret_cast<const float4*>(&s.gcum[buf][col0 + 4 * v]);
      const float4 b4 = *reinterpret_cast<const float4*>(&s.beta[buf][col0 + 4 * v]);
      g_col[4 * v] = g4.x, g_col[4 * v + 1] = g4.y, g_col[4 * v + 2] = g4.z, g_col[4 * v + 3] = g4.w;
      beta_col[4 * v] = b4.x, beta_col[4 * v + 1] = b4.y, beta_col[4 * v + 2] = b4.z, beta_col[4 * v + 3] = b4.w;
    }
    const float g_row = s.gcum[buf][row];
#pragma unroll
    for (int c = 0; c < 32; c += 2) {
      float gated[2];
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int col = col0 + c + d;
        gated[d] = row < rows && row >= col ? exp2_approx(g_row - g_col[c + d]) * a_r[c + d] * beta_col[c + d] : 0.f;
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
    const int col0 = 64 * group;  // this group's value columns
    // Passes without o (the CP state pass) skip Q entirely: its
    // loads, QS, QK^T, P and P Vd. Made visibly uniform like `group`.
    const bool with_o = __shfl_sync(0xffffffffu, item.write_o ? 1 : 0, 0) != 0;

    Acc state[2];
    load_initial_state(item, col0, state);
    store_state_copy(s, state, group);

    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    auto chunk_rows = [&](int64_t c) {
      const int64_t left = item.eos - (item.bos + c * kChunk);
      return static_cast<int>(left < kChunk ? left : kChunk);
    };
    if (num_chunks > 0) load_chunk(p, s, b, item.bos, chunk_rows(0), hk, h, item.zero_v, with_o, 0);
    ChunkGates gates;  // warp 0: the gates of the chunk about to run
    if (warp == 0 && num_chunks > 0) gates = fetch_chunk_gates(p, b, item.bos, chunk_rows(0), h);
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t t0 = item.bos + c * kChunk;
      const int rows = chunk_rows(c);
      const int buf = static_cast<int>(c & 1);
      const float* gcum = s.gcum[buf];
      cp_async_wait<0>();  // chunk c's tiles (issued one chunk ago)
      if (warp == 0) store_chunk_gates(s.gcum[buf], s.beta[buf], gates);  // last read two chunks ago
      wg::fence_shared_to_async();  // the landed tiles and the state copy, for the wgmmas below
      __syncthreads();              // ... and chunk c-1 is done with every buffer[buf ^ 1]
      if (c + 1 < num_chunks) {
        load_chunk(p, s, b, t0 + kChunk, chunk_rows(c + 1), hk, h, item.zero_v, with_o, buf ^ 1);
        if (warp == 0) gates = fetch_chunk_gates(p, b, t0 + kChunk, chunk_rows(c + 1), h);
      }
      const float gamma = gcum[kChunk - 1];

      // Phase 1: U and QS of this group's columns; Ag (g0) or P (g1) under them; W.
      Acc u, qs;
      {
        unsigned char* state_panel = s.state + group * kStatePanelBytes;
        wg::fence();
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16)
          wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(u, wg::descriptor<Major::kK>(s.k[buf], k0, kChunk),
                                                      wg::descriptor<Major::kMN>(state_panel, k0, kHeadDim), k0 > 0);
        if (with_o) {
#pragma unroll
          for (int k0 = 0; k0 < kHeadDim; k0 += 16)
            wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(qs, wg::descriptor<Major::kK>(s.q[buf], k0, kChunk),
                                                        wg::descriptor<Major::kMN>(state_panel, k0, kHeadDim), k0 > 0);
        }
      }
      // Chunk c-1's o (a full chunk: only the last may be partial) leaves its tile under these
      // wgmmas; the top barrier made the tile visible, the barrier closing phase 1 orders the copy before
      // Vd overwrites it.
      const unsigned char* o_tile = s.vd + group * kPanelBytes;
      if (group == 0 || !with_o) {
        wg::commit();
        if (with_o && c > 0) copy_out(p, o_tile, b, t0 - kChunk, kChunk, h, col0);
        if (group == 0) gated_inverse(s, buf, rows);
        wg::wait<0>();
      } else {
        Acc qk;
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16)
          wg::mma_ss<Elem, 64, Major::kK, Major::kK>(qk, wg::descriptor<Major::kK>(s.q[buf], k0, kChunk),
                                                     wg::descriptor<Major::kK>(s.k[buf], k0, kChunk), k0 > 0);
        wg::commit();
        if (c > 0) copy_out(p, o_tile, b, t0 - kChunk, kChunk, h, col0);
        wg::wait<0>();
        wg::fence_operand(qk);
        const float g_rows[2] = {gcum[acc_row(0)], gcum[acc_row(2)]};
        store_fragments(s.p, 0, [&](int j, int e) {  // P = G (.) QK^T, lower triangle with diagonal
          const int row = acc_row(e), col = acc_col(j, e);
          return row >= col ? exp2_approx(g_rows[e / 2] - gcum[col]) * qk[4 * j + e] : 0.f;
        });
      }
      wg::fence_operand(u);
      wg::fence_operand(qs);
      unsigned char* w_panel = s.v[buf] + group * kPanelBytes;
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // W = V - Gamma U in place over V; Gamma QS in registers
        const int row = acc_row(2 * half);
        const float decay = exp2_approx(gcum[row]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int e = 2 * half;
          Elem* w = element(w_panel, wg::swizzled_offset(row, acc_col(j, e)));
          store_pair(w, to_float(w[0]) - decay * u[4 * j + e], to_float(w[1]) - decay * u[4 * j + e + 1]);
          if (with_o) {
            qs[4 * j + e] *= decay;
            qs[4 * j + e + 1] *= decay;
          }
        }
      }
      wg::fence_shared_to_async();  // W, Ag, P
      __syncthreads();

      // Phase 2: Vd = Ag @ W of this group's columns (u holds Vd from here on).
      wg::fence();
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(u, wg::descriptor<Major::kK>(s.ag, k0, kChunk),
                                                    wg::descriptor<Major::kMN>(w_panel, k0, kChunk), k0 > 0);
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(u);
      unsigned char* vd_panel = s.vd + group * kPanelBytes;
      unsigned char* vd_decayed_panel = s.vd_decayed + group * kPanelBytes;
      {
        const float rho[2] = {exp2_approx(gamma - gcum[acc_row(0)]), exp2_approx(gamma - gcum[acc_row(2)])};
        if (with_o) store_fragments(vd_panel, 0, [&](int j, int e) { return u[4 * j + e]; });
        store_fragments(vd_decayed_panel, 0, [&](int j, int e) { return rho[e / 2] * u[4 * j + e]; });
      }
      wg::fence_shared_to_async();  // Vd, rho Vd
      group_barrier(group);

      // Phase 3: O = Gamma QS + P @ Vd; S = e^gamma S + K^T @ (rho (.) Vd).
      issue_output_and_update(state, qs, gamma, with_o, s.p, s.k[buf], vd_panel, vd_decayed_panel);
      wg::wait<0>();
      wg::fence_operand(state[0]);
      wg::fence_operand(state[1]);
      wg::fence_operand(qs);
      if (with_o)  // o into the Vd panel (P Vd has read it); copied out under the next chunk's wgmmas
        store_fragments(vd_panel, 0, [&](int j, int e) { return p.scale * qs[4 * j + e]; });
      store_state_copy(s, state, group);  // this group's K S and Q S read the old copy before its barrier
      store_checkpoint(p, item, c, rows, h, col0, state);
    }

    if (with_o && num_chunks > 0) {  // the last chunk's o
      group_barrier(group);
      const int64_t last = num_chunks - 1;
      copy_out(p, s.vd + group * kPanelBytes, b, item.bos + last * kChunk, chunk_rows(last), h, col0);
    }

    // The work item and column offset again (pure): not kept in registers across the loop.
    if (const StateBlock final = work_item(p, blockIdx.x, blockIdx.y, blockIdx.z).final; final.base != nullptr)
      store_state(final, 64 * static_cast<int>(threadIdx.x / 128), state);
  }
};

template <typename Elem, typename InverseT>
__global__ void __launch_bounds__(256, 1) fused_forward_wg_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  FusedForwardWg<Elem, InverseT>::run(p);
}

}  // namespace flashgdn::kern
