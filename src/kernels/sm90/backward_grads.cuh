// The backward's gradient pass (sm_90a, wgmma): every gradient of one chunk of one v-head from the
// state entering the chunk (S^T, chunk_states) and the state gradient leaving it (dS^T,
// chunk_grad_states from the dS pass's main mode, backward_ds_pass.cuh): no recurrence, so the
// grid covers every (chunk, v-head) at once. The equations are those of one chunk of
// src/reference/backward_chunked.cpp (float64) without the dS update.
//
// Grid: one persistent CTA per SM (216 KiB), items (chunk, v-head) index = chunk * Hv + h (a chunk's
// v-heads side by side: their K, Q rows shared in L2) taken in strides of the grid; block 256 threads
// = 2 warpgroups g. The next item's loads run under this item's last stages: its early set (V, dO,
// dS^T and its gate record, into a landing slot of its own) is issued after stage C, its S^T after
// stage D, its late set (K, Q; nothing where they are kept: a unit's next v-head) and its Ag (own
// mbarrier, waited at stage B) after stage E's wgmmas, its A_r (registers) under E's wgmmas, where the
// issuer also looks up the item after it. Every product has M = 64 tokens; group g owns columns 64
// g .. of the 128-wide products (V or K columns) and columns 32 g .. of the 64-wide ones (m64n32),
// except X (both groups form it whole: it is Y's A operand, from registers). Operand majors as in
// wgmma.cuh ("K" K-major, "MN"). With bp.group_sums a CTA takes units (chunk, q/k head) instead, their
// group's v-heads in a row (the item index is unchanged): dq, dk run as a sum over the group in fp32
// workspace (dq_heads, [unit][dq, dk][64][128], float2 columns swizzled by row): an item stages it in
// retired tiles (dq: Vd, dVd; dk: dU, dA_r, dP) for a bulk store, and the next v-head's item brings it
// back by bulk TMA into tiles its own stages have retired (dq: Vd, dVd after stage C, added into dq
// before E; dk: A_r, Pg, dA_r after D and its last 16 rows into dVd after dq's add, added after E) and
// adds; the group's last v-head writes dq, dk in q's dtype (staged in dU, Vd, then 16-byte row pieces,
// as direct_qk).
//
// Shared memory (128B-swizzled tiles, wgmma.cuh): K, Q, V (then W), dO [64][128]; S^T, dS^T
// [128][128]; Ag (then dM), A_r, Pg, dA_r, dP [64][64]; Vd, dVd, dU [64][128]; the item's gate record
// (gcum, beta) and the next item's landing slot (gates_in, 512 B);
// per-warp partial sums (fixed-order adds: deterministic).
//
// Stages (s = scale, Gamma = diag(e^g), rho = e^{gamma - g}, G[i,j] = e^{g_i - g_j} (i >= j)):
//   0  wait for the item's load sets but Ag (TMA, thread kIssuer, an mbarrier each: early, state,
//      late; a partial chunk's rows past its end zeroed after): K, Q (kept from the previous item
//      where it is the unit's previous v-head: the late set's phase then completes by a plain
//      arrival), V, dO, S^T, dS^T and the gate record (early set, landed in gates_in: copied into
//      gcum, beta); A_r (fp32 in registers in the group's [64, 32] layout, read from the chunk
//      inverse's fp16 rows, or fp32 ones with inverse_fp32) -> its bf16 tile
//   A  U = K S (SS: K "K", S^T rows 64 g.. "K");  W = V - Gamma U -> V's panel g
//      P = Q K^T (n32, K rows 32 g.. "K"), fp32 in registers;  s G (.) P -> Pg
//      under those wgmmas: <dS, S> = sum(dS^T (.) S^T) over the two bf16 tiles (8 warps' partials)
//   B  at its top, the wait for Ag (the gated copy of the chunk inverse, its own mbarrier; a partial
//      chunk's Ag rows zeroed after, then a barrier) Vd = Ag W (Ag "K", W panel g "MN") -> Vd;  dVd =
//      rho (.) (K dS) (dS^T rows 64 g.. "K") + Pg^T dO (Pg "MN", dO panel g "MN") -> dVd (the three
//      products in one round); a = rho (.) rowsum((K dS) (.) Vd) (= rowsum(K (.) dK_a) from the fp32
//      accumulators): dg_s -= a
//   C  dW = Ag^T dVd (Ag "MN", dVd panel g "MN") -> dv (HBM, staged in dU's panel g: D's dU S^T reads it)
//      dPg = dO Vd^T, dAg = dVd W^T (n32, B rows 32 g.. "K"): dP = s G (.) dPg -> dP,
//      dA_r = dAg (.) G (.) 1 beta^T -> dA_r, E = Pg (.) dPg + Ag (.) dAg:
//      dg_s += rowsum(E) - colsum(E), dbeta += colsum(dAg (.) G (.) A_r)
//      dQ_a = s Gamma (dO S^T) (S^T panel g "MN"), dK_a = rho (.) (Vd dS^T) (dS^T panel g "MN") in
//      registers (a second commit group, running under the first one's epilogue): dg_s +=
//      rowsum(Q (.) dQ_a) (dg_s's dK_a term is a's alone)
//   D  X = A_r^T dA_r (each group whole, n64: A_r "MN", dA_r "MN") -> A fragments;  then Y = X A_r^T
//      (RS, n32, A_r rows 32 g.. "K"), KK = K K^T (n32): dL = -StrictLower(Y), dbeta += rowsum(dL (.) KK),
//      dM = diag(beta) dL -> Ag's bytes;  E's first terms, which need nothing from D, in flight
//      under it (issued right behind X; waited for with Y, KK):
//      dq = dQ_a + dP K (K panel g "MN");  dk_rest = dU S^T = -Gamma (dW S^T) (dW in bf16 from dv's
//      staging, S^T panel g "MN", its own accumulator, rows scaled after): dg_s += rowsum(K (.) dk_rest)
//   E  dk = dK_a + dk_rest + dP^T Q (dP "MN") + dM K + dM^T K (dM "K", "MN"; onto dk_rest) -> HBM
//      (direct or a group's sum: stmatrix to dU, Vd panel g, group barrier, 16-byte row pieces);
//      dgamma = e^gamma <dS, S> + sum a at row 63 (<dS, S> from stage A, or for a sequence's last
//      chunk with a dS_T the pre-pass's, S in fp32: fwd.final_grad_dots), dg = reverse cumsum of dg_s,
//      dbeta -> HBM (dg by warp 0, dbeta by warp 1)
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/fused_forward_wg.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/tensor_map.h"
#include "kernels/sm90/timeline.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace flashgdn::kern {

// wgmma descriptors' high word (128-byte swizzle, SBO 1024: wg::descriptor's), read from constant
// memory so that ptxas cannot split a descriptor into a hoisted low word and a known high word: it
// then rebuilt the pair with carries at every k-step (up to 7 uniform operations a wgmma, not 2).
// Used by stage B's, D's and E's products (Vd, K dS, Pg^T dO; E's first terms, X, Y, K K^T, dk's rest):
// on stages A's and C's it cost more than it saved (ptxas' choice, recheck the SASS after any change
// here).
static __constant__ uint32_t kDescriptorHighWord = 1u << 30 | 1024 >> 4;

template <typename Elem>
struct BackwardGrads {
  using Tiles = FusedForwardWg<Elem, float>;  // accumulator coordinates, stmatrix of [64, 64] tiles
  using Major = wg::Major;
  using Acc = float[32];    // m64n64
  using Acc32 = float[16];  // m64n32
  using Fragments = uint32_t[4];  // the A operand of one RS k-step
  static constexpr int kThreads = 256;
  static constexpr int kIssuer = 128;  // group 1's first thread issues the loads
  static constexpr int kTokenTileBytes = Tiles::kTokenTileBytes;    // [64][128]
  static constexpr int kStateTileBytes = Tiles::kStateTileBytes;    // [128][128]
  static constexpr int kSquareTileBytes = Tiles::kSquareTileBytes;  // [64][64]
  static constexpr int kPanelBytes = Tiles::kPanelBytes;            // 64 rows of a 64-column panel
  static constexpr int kStatePanelBytes = Tiles::kStatePanelBytes;  // 128 rows of a 64-column panel

  // One work item: chunk `chunk_id` of v-head h (index = chunk_id * Hv + h: its row in the per-(chunk, v-head)
  // arrays, the chunk gates, the state rows, the pre-pass dots).
  struct Item {
    int64_t index, b, t0, chunk_id, seq;  // seq: the sequence (varlen) or batch entry
    int64_t inverse_row;  // the element of A_r's row 0 in the chunk inverse's rows ((b * seqlen + t0) * Hv + h) * 64
    int rows, h, hk;
    int group_rank;      // h's place among its q/k head's v-heads (formed by the issuer's lookup, not per item by all)
    bool group_last;     // h is its q/k head's last v-head
    bool sequence_last;  // the chunk ends its sequence
    uint32_t ordinal;  // the CTA's items before it: its load sets' mbarrier phase is ordinal % 2
    bool valid;
    // K, Q are the previous item's bytes (the same chunk and q/k head: group_sums' next v-head of a
    // unit), kept in their tiles: the late set loads nothing (issue_late) and zero_rows skips them
    bool keep_qk;
  };
  struct SharedStorage {
    alignas(1024) unsigned char k[kTokenTileBytes];
    alignas(1024) unsigned char q[kTokenTileBytes];
    alignas(1024) unsigned char v[kTokenTileBytes];  // V, then W
    alignas(1024) unsigned char d_o[kTokenTileBytes];
    alignas(1024) unsigned char st[kStateTileBytes];   // S^T entering the chunk
    alignas(1024) unsigned char dst[kStateTileBytes];  // dS^T leaving it
    alignas(1024) unsigned char ag[kSquareTileBytes];  // Ag, then dM
    alignas(1024) unsigned char ar[kSquareTileBytes];
    alignas(1024) unsigned char pg[kSquareTileBytes];  // s G (.) P
    alignas(1024) unsigned char dar[kSquareTileBytes];
    alignas(1024) unsigned char dp[kSquareTileBytes];
    alignas(1024) unsigned char vd[kTokenTileBytes];
    alignas(1024) unsigned char dvd[kTokenTileBytes];
    alignas(1024) unsigned char du[kTokenTileBytes];
    // the item's gate record (chunk_gates.cuh): gcum, then beta, copied at stage 0 from gates_in, where
    // the early set lands it (after the previous item's stage C, while that item still reads gcum, beta)
    alignas(16) float gcum[kChunk];
    float beta[kChunk];
    alignas(16) float gates_in[2 * kChunk];
    float dgs_part[8][kChunk];     // per warp: dg_s row and column terms
    float dbeta_col[8][kChunk];    // per warp: colsum(dAg G A_r) over its 16 rows
    float dbeta_row[8][kChunk];    // per warp: rowsum(dL (.) KK) over its group's 32 columns
    float ka_part[8];
    float state_dot_part[8];  // <dS, S>: per warp over its share of the state tiles, or the pre-pass's 8 partials
    alignas(8) uint64_t early, state, late, ag_set;  // the item's four load sets (ag_set: Ag alone)
    uint64_t partial, partial_dk;     // group_sums: the group's running dq sum, its dk sum
    Item next;                        // the item whose loads are in flight (thread 128 -> all)
    Item after;                       // the item after next, looked up an item ahead (thread 128 only)
  };
  static_assert(sizeof(SharedStorage) <= 232448, "above the 227 KiB of shared memory a block may opt in to");
  static_assert(offsetof(SharedStorage, beta) == offsetof(SharedStorage, gcum) + kChunk * 4, "one gate record");
  // keep_qk needs K and Q untouched between items: no stage stages anything in them (the group sums'
  // staging and bulk loads use Vd, dVd, dU, A_r .. dP, all past them). They lead the storage so that
  // an offset computed from another tile cannot fall into them.
  static_assert(offsetof(SharedStorage, k) == 0 &&
                    offsetof(SharedStorage, v) == offsetof(SharedStorage, q) + kTokenTileBytes,
                "K, Q first and apart from every staging tile");

  static __device__ __forceinline__ int acc_row(int e) { return Tiles::acc_row(e); }
  static __device__ __forceinline__ int acc_col(int j, int e) { return Tiles::acc_col(j, e); }
  // A thread's partial sums of its two accumulator rows (x[half]: row acc_row(2 half)) summed over
  // the row's 4 lanes and added to dst[row]: the first step trades halves (odd lanes keep half 1),
  // so lane % 4 == 0 ends with row acc_row(0)'s sum and lane % 4 == 1 with acc_row(2)'s (2 shuffles
  // for both rows, not 4).
  static __device__ __forceinline__ void add_row_sums(float* dst, const float (&x)[2]) {
    const bool odd = threadIdx.x % 2 != 0;
    float v = (odd ? x[1] : x[0]) + __shfl_xor_sync(0xffffffffu, odd ? x[0] : x[1], 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (threadIdx.x % 4 < 2) dst[acc_row(0) + 8 * (threadIdx.x % 2)] += v;
  }
  // Column sums over the 8 lanes of an accumulator column (a warp's 8 rows lane / 4) of two column
  // pairs, x[q][d] at columns 2 (lane % 4) + d of a block, one sum a lane: the first step trades
  // pairs (lanes 16.. keep q = 1), the second columns (lanes 8..15, 24.. keep d = 1), the third adds:
  // lane l returns pair l / 16's column 2 (l % 4) + l / 8 % 2 (lanes l and l ^ 4 alike), 4 shuffles
  // for the four columns, not 6.
  static __device__ __forceinline__ float column_quad_sum(const float (&x)[2][2]) {
    const bool upper = threadIdx.x % 32 >= 16, odd = threadIdx.x % 16 >= 8;
    float v[2];
#pragma unroll
    for (int d = 0; d < 2; ++d) v[d] = (upper ? x[1][d] : x[0][d]) + __shfl_xor_sync(0xffffffffu, upper ? x[0][d] : x[1][d], 16);
    const float w = (odd ? v[1] : v[0]) + __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 8);
    return w + __shfl_xor_sync(0xffffffffu, w, 4);
  }

  // unpack_pair, with bf16's upper half by a mask (one LOP3): __bfloat1622float2 moves it down and
  // back up (PRMT + IMAD.SHL); the same values.
  static __device__ __forceinline__ float2 unpack(uint32_t bits) {
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
      return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
    else
      return unpack_pair<Elem>(bits);
  }

  // A 64-column panel's elements at this thread's m64nN accumulator positions, by ldmatrix_x4 of
  // column blocks j0 .. j0 + N / 8 - 1 (Tiles::fragment_rows): f(j, e, pair) for accumulator
  // elements 4 j + e, e + 1 (e even), j counted from j0.
  template <int kN, typename F>
  static __device__ __forceinline__ void for_panel_pairs(const unsigned char* panel, int j0, F&& f) {
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      uint32_t r[4];
      ldmatrix_x4(r, Tiles::fragment_rows(const_cast<unsigned char*>(panel), 0, j0 + j));
#pragma unroll
      for (int m = 0; m < 4; ++m) f(j + m / 2, 2 * (m % 2), unpack(r[m]));
    }
  }
  // value(j, e) of an m64nN accumulator -> a 64-column panel at column blocks j0 .. (stmatrix_x4).
  template <int kN, typename F>
  static __device__ __forceinline__ void store_panel(unsigned char* panel, int j0, F&& value) {
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      uint32_t regs[4];
      Tiles::pack_x4(regs, j, value);
      stmatrix_x4(Tiles::fragment_rows(panel, 0, j0 + j), regs);
    }
  }

  // Rows 0 .. rows - 1 of a chunk's staged output panel g ([64][64]: its tokens t0.., columns 64 g.. of
  // `head` in the token-major output `out`, store_output's panel where the chunk is partial or TMA is off)
  // in 16-byte pieces, as Tiles::copy_rows (thread t of the group: piece t % 8 of rows t / 8 + 16 i),
  // with the addresses formed once: the pieces of a thread share the swizzle (row % 8), so the shared one
  // steps by immediates and the global one by 16 rows.
  static __device__ __forceinline__ void copy_rows(void* out, const RowStrides& strides, int group, int head,
                                                   int64_t b, int64_t t0, const unsigned char* panel, int rows) {
    const int64_t row_stride = strides.token;
    const int row = threadIdx.x % 128 / 8, vec = threadIdx.x % 8;
    const unsigned char* src = panel + wg::swizzled_offset(row, vec * 8);
    Elem* dst = static_cast<Elem*>(out) + b * strides.batch + t0 * row_stride + head * strides.head + 64 * group +
                row * row_stride + vec * 8;
#pragma unroll
    for (int i = 0; i < kChunk / 16; ++i) {
      if (row + 16 * i < rows)
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src + i * 16 * 128);
      dst += 16 * row_stride;
    }
  }

  // A full chunk's staged output panel g (64 tokens x 64 columns at column 64 g of `head`) to HBM by
  // TMA from the group's first thread (tma_outputs; its stmatrix writes fenced for the async proxy and
  // the group's barrier passed): its bulk group is waited for (read) by the same thread before the
  // panel's tile is rewritten (stage E's barrier for dU's dv, stage A's end for dU's dq and Vd's dk).
  static __device__ __forceinline__ void store_output(const CUtensorMap* map, const unsigned char* panel, int group,
                                                      int head, const Item& it) {
    if (threadIdx.x % 128 == 0)
      tma::store_4d(map, panel, 64 * group, head, static_cast<int>(it.t0), static_cast<int>(it.b));
  }

  // Row dots of an m64n64 accumulator with a 64-column panel at the same positions, added to this
  // thread's row partials (row_sum[half]: row acc_row(2 half), as add_row_sums) by two FFMA a pair.
  static __device__ __forceinline__ void add_row_dots(float (&row_sum)[2], const Acc& acc, const unsigned char* panel) {
    for_panel_pairs<64>(panel, 0, [&](int j, int e, float2 x) {
      row_sum[e / 2] = fmaf(x.y, acc[4 * j + e + 1], fmaf(x.x, acc[4 * j + e], row_sum[e / 2]));
    });
  }

  // Descriptors from the storage's encoded shared address (wg::encode), formed once before the item
  // loop (run): a tile lies at a constant offset from the storage (group g's panels g panels on), so
  // a product's descriptor at k-step 0 is that word plus the offset / 16, where the tile's address
  // took the masking chain (address & 0x3FFFF) >> 4, | LBO per product and item.
  struct StorageWord {
    uint32_t word;              // wg::encode of the storage's shared address
    const unsigned char* base;  // the storage, whose offsets are added
  };
  static __device__ __forceinline__ uint32_t tile_word(const StorageWord& sw, const void* tile) {
    return sw.word + static_cast<uint32_t>(static_cast<const unsigned char*>(tile) - sw.base) / 16;
  }
  // wg::pinned_descriptor_from_word of a tile (stages A, C), and with the high word from
  // kDescriptorHighWord (the same value: stages B, D and E)
  template <Major kMajor>
  static __device__ __forceinline__ uint64_t pinned_descriptor(const StorageWord& sw, const void* tile, int rows) {
    return wg::pinned_descriptor_from_word<kMajor>(tile_word(sw, tile), rows);
  }
  template <Major kMajor>
  static __device__ __forceinline__ uint64_t opaque_descriptor(const StorageWord& sw, const void* tile, int rows) {
    uint64_t desc = (wg::descriptor_from_word<kMajor>(tile_word(sw, tile), 0, rows) & 0xFFFFFFFFull) |
                    uint64_t{kDescriptorHighWord} << 32;
    asm volatile("" : "+l"(desc));
    return desc;
  }
  // d (+)= A B over kK in wgmma k-steps from such descriptors (wg::k_step), the first step overwriting
  // d unless `accumulate`
  template <int N, Major kMajorA, Major kMajorB, int kK, bool kOpaque>
  static __device__ __forceinline__ void mma_tiles(float (&d)[N / 2], const StorageWord& sw, const void* a, int a_rows,
                                                   const void* b, int b_rows, bool accumulate) {
    const uint64_t a0 = kOpaque ? opaque_descriptor<kMajorA>(sw, a, a_rows) : pinned_descriptor<kMajorA>(sw, a, a_rows);
    const uint64_t b0 = kOpaque ? opaque_descriptor<kMajorB>(sw, b, b_rows) : pinned_descriptor<kMajorB>(sw, b, b_rows);
#pragma unroll
    for (int k0 = 0; k0 < kK; k0 += 16)
      wg::mma_ss<Elem, N, kMajorA, kMajorB>(d, wg::k_step<kMajorA>(a0, k0, a_rows), wg::k_step<kMajorB>(b0, k0, b_rows),
                                            accumulate || k0 > 0);
  }
  template <int N, Major kMajorA, Major kMajorB, int kK>
  static __device__ __forceinline__ void mma_opaque(float (&d)[N / 2], const StorageWord& sw, const void* a, int a_rows,
                                                    const void* b, int b_rows, bool accumulate) {
    mma_tiles<N, kMajorA, kMajorB, kK, true>(d, sw, a, a_rows, b, b_rows, accumulate);
  }
  template <int N, Major kMajorA, Major kMajorB, int kK>
  static __device__ __forceinline__ void mma_pinned(float (&d)[N / 2], const StorageWord& sw, const void* a, int a_rows,
                                                    const void* b, int b_rows, bool accumulate) {
    mma_tiles<N, kMajorA, kMajorB, kK, false>(d, sw, a, a_rows, b, b_rows, accumulate);
  }

  // Stage E's first terms, which need nothing from stage D: dq += dP K onto the registers' dQ_a and
  // dk_rest = dW S^T (dW: dv's bf16 staging in dU's tile; K, S^T panel g "MN"), issued (not
  // committed); stage D scales dk_rest's rows by -e^g (dU S^T = -Gamma dW S^T). dU S^T has its own
  // accumulator: dg_s's term rowsum(K (.) dU S^T) is then one row dot, not rowsum(K (.) (dK_a + dU S^T))
  // less stage C's rowsum(K (.) dK_a).
  static __device__ __forceinline__ void issue_first_terms(const SharedStorage& s, const StorageWord& sw, int group,
                                                          Acc& dq, Acc& dk_rest) {
    mma_opaque<64, Major::kK, Major::kMN, kChunk>(dq, sw, s.dp, kChunk, s.k + group * kPanelBytes, kChunk, true);
    mma_opaque<64, Major::kK, Major::kMN, kHeadDim>(dk_rest, sw, s.du, kChunk, s.st + group * kStatePanelBytes,
                                                    kHeadDim, false);
  }

  // This CTA's item after `index`: index + gridDim.x, or with bp.group_sums the next v-head of the
  // group (a unit: a q/k head's v-heads of one chunk, index / group), then the unit gridDim.x on.
  static __device__ __forceinline__ int64_t next_index(const BackwardParams& bp, int64_t index) {
    if (!bp.group_sums) return index + gridDim.x;
    const int group = bp.fwd.num_v_heads / bp.fwd.num_qk_heads;
    return (index + 1) % group != 0 ? index + 1 : index + 1 + static_cast<int64_t>(gridDim.x - 1) * group;
  }
  static __device__ __forceinline__ int64_t first_index(const BackwardParams& bp) {
    return bp.group_sums ? static_cast<int64_t>(blockIdx.x) * (bp.fwd.num_v_heads / bp.fwd.num_qk_heads) : blockIdx.x;
  }

  // The first valid item at `index` or after it (next_index; varlen grids have chunk ids past the
  // last sequence's chunks: the last items). `from`: this CTA's current item (or invalid), whose chunk
  // is at or before index's: the same chunk (group_sums' next v-head) needs no lookup, a later one
  // walks on from its sequence (locate_chunk_after).
  static __device__ Item find_item(const BackwardParams& bp, int64_t index, const Item& from) {
    const ForwardParams& p = bp.fwd;
    Item it{};
    for (const int64_t total = p.max_chunks * p.num_v_heads; index < total; index = next_index(bp, index)) {
      const int64_t chunk_id = index / p.num_v_heads;
      if (from.valid && chunk_id == from.chunk_id) {
        it = from;
      } else {
        ChunkLocation where;
        if (!(from.valid ? locate_chunk_after(p, chunk_id, from.seq, where) : locate_chunk(p, chunk_id, where))) continue;
        it.chunk_id = chunk_id;
        it.seq = where.seq_index;
        it.b = where.seq.batch;
        it.t0 = where.first_token;
        it.rows = where.rows;
        it.sequence_last = where.first_token + where.rows == where.seq.eos;
        it.valid = true;
      }
      it.index = index;
      it.h = static_cast<int>(index % p.num_v_heads);
      const int group = p.num_v_heads / p.num_qk_heads;
      it.hk = it.h / group;
      it.group_rank = it.h - it.hk * group;
      it.group_last = it.group_rank + 1 == group;
      it.inverse_row = ((it.b * p.seqlen + it.t0) * p.num_v_heads + it.h) * kChunk;
      return it;
    }
    return it;
  }

  // The item after `next` (invalid after an invalid one).
  static __device__ __forceinline__ Item item_after(const BackwardParams& bp, const Item& next) {
    return next.valid ? find_item(bp, next_index(bp, next.index), next) : Item{};
  }

  // The boxes of an item in three sets with one mbarrier each, so that the next item's loads run under
  // this item's last stages: the early set (V, dO, dS^T: their last reader is stage C; and the gate
  // record into gates_in, read only by stage 0's copy into gcum, beta), S^T (read up to stage D), the
  // late set (K, Q: read up to stage E) and Ag (read up to stage C, then dM's bytes up to stage E) on
  // its own mbarrier, issued with the late set but waited for at stage B's top. Each set is issued
  // exactly once for every valid item, in the items' order, and its issue for item n + 1 comes after
  // item n's wait on it: item n's wait is its barrier's phase n, parity ordinal % 2.
  static constexpr uint32_t kGateBytes = 2 * kChunk * 4;
  static constexpr uint32_t kEarlyBytes = 2 * kTokenTileBytes + kStateTileBytes + kGateBytes;
  static constexpr uint32_t kLateBytes = 2 * kTokenTileBytes;
  static __device__ void issue_early(const ForwardParams& p, const BackwardTileMaps& maps, SharedStorage& s,
                                     const Item& it) {
    const int b = static_cast<int>(it.b), t0 = static_cast<int>(it.t0);
    tma::arrive_expect_bytes(&s.early, kEarlyBytes);
    for (int panel = 0; panel < 2; ++panel) {
      const int col = 64 * panel;
      tma::load_4d(s.v + panel * kPanelBytes, &maps.inputs.v, &s.early, col, it.h, t0, b);
      tma::load_4d(s.d_o + panel * kPanelBytes, &maps.d_o, &s.early, col, it.h, t0, b);
      tma::load_2d(s.dst + panel * kStatePanelBytes, &maps.grad_states, &s.early, col, state_row(it));
    }
    tma::load_bulk(s.gates_in, p.chunk_gates + it.index * 2 * kChunk, kGateBytes, &s.early);
  }
  // An item with keep_qk completes the late set's phase by a plain arrival (the barrier's count is 1)
  // and loads nothing: the phase accounting stays one phase an item, so its wait keeps parity
  // ordinal % 2 and returns at once.
  static __device__ void issue_late(const ForwardParams& p, const BackwardTileMaps& maps, SharedStorage& s,
                                    const Item& it) {
    if (it.keep_qk) {
      tma::arrive(&s.late);
      return;
    }
    const int b = static_cast<int>(it.b), t0 = static_cast<int>(it.t0);
    tma::arrive_expect_bytes(&s.late, kLateBytes);
    for (int panel = 0; panel < 2; ++panel) {
      const int col = 64 * panel;
      tma::load_4d(s.k + panel * kPanelBytes, &maps.inputs.k, &s.late, col, it.hk, t0, b);
      tma::load_4d(s.q + panel * kPanelBytes, &maps.inputs.q, &s.late, col, it.hk, t0, b);
    }
  }
  static __device__ void issue_ag(const BackwardTileMaps& maps, SharedStorage& s, const Item& it) {
    tma::arrive_expect_bytes(&s.ag_set, kSquareTileBytes);
    tma::load_4d(s.ag, &maps.inputs.inverse, &s.ag_set, 0, it.h, static_cast<int>(it.t0), static_cast<int>(it.b));
  }
  static __device__ void issue_state(const ForwardParams& p, const BackwardTileMaps& maps, SharedStorage& s,
                                     const Item& it) {
    tma::arrive_expect_bytes(&s.state, kStateTileBytes);
    for (int panel = 0; panel < 2; ++panel)
      tma::load_2d(s.st + panel * kStatePanelBytes, &maps.states, &s.state, 64 * panel, state_row(it));
  }
  static __device__ __forceinline__ int state_row(const Item& it) { return static_cast<int>(it.index * kHeadDim); }

  // group_sums: a unit's running sum, dq then dk, each [64][128] fp32 (32 KiB) with the float2 at
  // (row, pair c) stored at pair c ^ 4 (row % 4): the warps' float2 reads of the staged copy then
  // touch every bank twice (two wavefronts), and each 4 lanes still write one 32-byte sector.
  static constexpr uint32_t kPartialBytes = kChunk * kHeadDim * 4;
  static __device__ __forceinline__ float* unit_partial(const BackwardParams& bp, const Item& it) {
    const int64_t unit = it.chunk_id * bp.fwd.num_qk_heads + it.hk;
    return bp.dq_heads + unit * 2 * kChunk * kHeadDim;
  }
  static __device__ __forceinline__ int partial_offset(int row, int col) {  // col even
    return row * kHeadDim + 2 * ((col / 2) ^ (4 * (row % 4)));
  }
  // The staged copy (bulk TMA into retired tiles, 8 KiB a [16][128] block), each half on its own
  // mbarrier: dq in Vd, dVd (issued after stage C, added at D's end); dk's rows 0..47 in A_r, Pg,
  // dA_r (issued after stage D), rows 48..63 where dq's rows 48..63 were (dVd's second half, issued
  // once dq's add is done): both land under stage E's wgmmas.
  static constexpr uint32_t kPartialBlockBytes = kPartialBytes / 4;
  static constexpr int kDkHeadRows = 3 * kChunk / 4;  // dk's rows in A_r, Pg, dA_r
  static __device__ __forceinline__ void issue_partial_dq(const BackwardParams& bp, SharedStorage& s, const Item& it) {
    static_assert(offsetof(SharedStorage, dvd) == offsetof(SharedStorage, vd) + kTokenTileBytes, "Vd, dVd adjacent");
    tma::arrive_expect_bytes(&s.partial, kPartialBytes);
    tma::load_bulk(s.vd, unit_partial(bp, it), kPartialBytes, &s.partial);
  }
  static __device__ __forceinline__ void issue_partial_dk_head(const BackwardParams& bp, SharedStorage& s,
                                                               const Item& it) {
    static_assert(offsetof(SharedStorage, dar) == offsetof(SharedStorage, ar) + 2 * kSquareTileBytes &&
                      kSquareTileBytes == kPartialBlockBytes,
                  "A_r, Pg, dA_r back to back, 16 rows of the fp32 sum each");
    tma::arrive_expect_bytes(&s.partial_dk, kPartialBytes);
    tma::load_bulk(s.ar, unit_partial(bp, it) + kChunk * kHeadDim, 3 * kPartialBlockBytes, &s.partial_dk);
  }
  static __device__ __forceinline__ void issue_partial_dk_tail(const BackwardParams& bp, SharedStorage& s,
                                                               const Item& it) {
    tma::load_bulk(s.vd + 4 * partial_offset(kDkHeadRows, 0), unit_partial(bp, it) + (kChunk + kDkHeadRows) * kHeadDim,
                   kPartialBlockBytes, &s.partial_dk);
  }
  // Byte offset of this thread's float2 at (row, 64 g + acc_col(j, 0)) in a staged sum: partial_offset's
  // swizzle flips bits 5..7 of the row's offset at j = 0 by 32 j (pair c = 32 g + 4 j + lane % 4,
  // c ^ 4 (row % 4) = 32 g + 4 (j ^ row % 4) + lane % 4), and row + 8 lies 4096 bytes on (the same
  // row % 4): one LOP3 an address pair, not the swizzle per element.
  static __device__ __forceinline__ uint32_t partial_byte_offset(uint32_t row_base, int j) { return row_base ^ (32u * j); }
  static __device__ __forceinline__ uint32_t partial_row_base(int row, int group) {
    return 4u * partial_offset(row, 64 * group + acc_col(0, 0));
  }

  // The staged dq (or dk: rows 48..63 at dq's own places, the thread that adds dk's row there has read
  // dq's before, and stages its own outgoing dq there after) at this thread's accumulator positions of
  // group g's columns, added to acc. A thread's rows r, r + 8 lie on one side of row 48.
  static __device__ __forceinline__ void add_staged_partial(const SharedStorage& s, bool is_k, int group, Acc& acc) {
    const int row = acc_row(0);
    const unsigned char* tile = is_k && row < kDkHeadRows ? s.ar : s.vd;
    const uint32_t base = partial_row_base(row, group);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const unsigned char* at = tile + partial_byte_offset(base, j);
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const float2 x = *reinterpret_cast<const float2*>(at + (e / 2) * 8 * kHeadDim * 4);
        acc[4 * j + e] += x.x, acc[4 * j + e + 1] += x.y;
      }
    }
  }

  // The running sum staged by run_item (dq in Vd, dVd; dk rows 0..31 in dU, 32..63 in dA_r, dP) to
  // HBM by bulk store (one bulk group: waited for its reads before stage B, in full before the next
  // item's bulk loads of it).
  static __device__ __forceinline__ void store_running_sum(SharedStorage& s, float* partial) {
    static_assert(offsetof(SharedStorage, dp) == offsetof(SharedStorage, dar) + kSquareTileBytes, "dA_r, dP adjacent");
    tma::store_bulk(partial, s.vd, kPartialBytes);
    tma::store_bulk(partial + kChunk * kHeadDim, s.du, kPartialBytes / 2);
    tma::store_bulk(partial + kChunk * kHeadDim * 3 / 2, s.dar, kPartialBytes / 2);
    tma::commit_bulk();
  }

  // Warpgroup g's named barrier (ids 1, 2; 0 is __syncthreads).
  static __device__ __forceinline__ void group_sync(int group) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
  }
  // Rows rows..63 of the token tiles (stage 0) and of Ag (stage B's top, after Ag's own wait) set to
  // zero (a partial chunk's boxes bring the next sequence's tokens there): 16-byte units, a swizzled row
  // keeps its 128 bytes.
  // (K, Q's rows skipped where they are kept from the previous item: zeroed by it, the same rows).
  static __device__ void zero_rows(SharedStorage& s, int rows, bool keep_qk) {
    static_assert(offsetof(SharedStorage, d_o) == offsetof(SharedStorage, k) + 3 * kTokenTileBytes,
                  "K, Q, V, dO back to back: eight consecutive panels");
    const int units = (kChunk - rows) * 8;  // per 64-row panel
    for (int i = threadIdx.x + (keep_qk ? 4 * units : 0); i < 8 * units; i += kThreads)
      *reinterpret_cast<uint4*>(s.k + (i / units) * kPanelBytes + rows * 128 + (i % units) * 16) = make_uint4(0, 0, 0, 0);
  }
  static __device__ void zero_ag_rows(SharedStorage& s, int rows) {
    const int units = (kChunk - rows) * 8;
    for (int i = threadIdx.x; i < units; i += kThreads)
      *reinterpret_cast<uint4*>(s.ag + rows * 128 + i * 16) = make_uint4(0, 0, 0, 0);
  }

  // A_r at this thread's [64, 32] accumulator positions of group g (columns 32 g ..), zero past the
  // chunk's rows and above the diagonal; element 4 j + e. Its rows are fp16 where the chunk inverse
  // merged in fp16 (p.inverse_rows_fp16, the same values in half the bytes), else fp32. The loads are
  // issued here and left in flight (under stage E's wgmmas): fp16 words are kept raw, one a pair in
  // element 4 j + e, and unpack_inverse converts them at the first use (converting here waited on each
  // load in turn: the gradient pass +15..+29%).
  static __device__ __forceinline__ void load_inverse(const ForwardParams& p, const Item& it, int group, Acc32& a_r) {
    // the thread's two rows (acc_row(0), + 8) from their first column: element (j, e) lies 8 j + e % 2
    // columns on (immediate offsets); the fp16 / fp32 choice made once, not per element. The item's
    // row 0 comes from the lookup (64-bit, formed once by the issuer), the thread's offset from it in
    // 32 bits (64 rows of Hv * 64 elements)
    const int rows = it.rows;
    const int row_pitch = p.num_v_heads * kChunk;
    const int row0 = acc_row(0), col0 = 32 * group + acc_col(0, 0);
    const int64_t first = it.inverse_row + (row0 * row_pitch + col0);
    if (p.inverse_rows_fp16) {  // the pair's word, raw (element 4 j + e + 1 is written by unpack_inverse)
      const __half* src[2] = {static_cast<const __half*>(p.inverse) + first,
                              static_cast<const __half*>(p.inverse) + first + 8 * row_pitch};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int row = acc_row(e), col = 32 * group + acc_col(j, e);
          a_r[4 * j + e] =
              row < rows && col <= row ? __uint_as_float(*reinterpret_cast<const uint32_t*>(src[e / 2] + 8 * j)) : 0.f;
        }
    } else {
      const float* src[2] = {static_cast<const float*>(p.inverse) + first,
                             static_cast<const float*>(p.inverse) + first + 8 * row_pitch};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int row = acc_row(e), col = 32 * group + acc_col(j, e);
          float2 x = make_float2(0.f, 0.f);
          if (row < rows && col <= row)
            x = col < row ? *reinterpret_cast<const float2*>(src[e / 2] + 8 * j) : make_float2(src[e / 2][8 * j], 0.f);
          a_r[4 * j + e] = x.x;
          a_r[4 * j + e + 1] = x.y;
        }
    }
  }

  // load_inverse's fp16 words unpacked in place (a word of zeros is two zeros); the diagonal's right
  // neighbour (written as zero, not trusted) set to zero.
  static __device__ __forceinline__ void unpack_inverse(const ForwardParams& p, int group, Acc32& a_r) {
    if (!p.inverse_rows_fp16) return;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        float2 x = unpack_pair<__half>(__float_as_uint(a_r[4 * j + e]));
        if (32 * group + acc_col(j, e) == acc_row(e)) x.y = 0.f;
        a_r[4 * j + e] = x.x;
        a_r[4 * j + e + 1] = x.y;
      }
  }

  // A sequence's last chunk takes <dS_T, S> from the pre-pass, with S in fp32 (fwd.final_grad_dots,
  // written where a dS_T is given): the user's dht reaches the last tokens' dg through it whole.
  static __device__ __forceinline__ bool prepass_dot(const BackwardParams& bp, const Item& it) {
    return it.sequence_last && bp.fwd.final_grad_dots != nullptr;
  }

  // ldmatrix_x4 (warp_mma.cuh) from a shared-window address formed here (state_dot's XOR steps)
  static __device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t shared_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address));
  }
  // <dS, S> over this warp's 16 rows of the S^T and dS^T tiles (one layout: the same box geometry and
  // swizzle) on the tensor cores: with the rows' S^T as A (m16, k = the 128 columns) and their dS^T as
  // B (two n8 halves), entry (r, r) of the product is row r's dot, so the diagonal's sum is the warp's
  // share (this lane's diagonal entries returned; 16 mma and 16 ldmatrix a warp, not 2048 products
  // from unpacked pairs). ldmatrix addresses: lane l reads A's row 16 w + l % 16 at k-unit l / 16 (the
  // A fragment's matrix order) and B's row 16 w + 8 (l / 16) + l % 8 at k-unit l / 8 % 2 (each n8
  // half's two matrices in consecutive registers); k-unit u of k-step ks lies at 16-byte unit
  // (u ^ row % 8) ^ 2 ks of a panel row (128-byte swizzle): one XOR a k-step and operand, the other
  // panel at an immediate.
  static __device__ __forceinline__ float state_dot(const SharedStorage& s) {
    const int lane = threadIdx.x % 32, a_row = 16 * (threadIdx.x / 32) + lane % 16;
    const int b_row = 16 * (threadIdx.x / 32) + 8 * (lane / 16) + lane % 8;  // b_row % 8 == a_row % 8
    const uint32_t a_first = smem_addr(s.st) + a_row * 128 + ((lane / 16) ^ (lane % 8)) * 16;
    const uint32_t b_first = smem_addr(s.dst) + b_row * 128 + ((lane / 8 % 2) ^ (lane % 8)) * 16;
    float diag[2][4] = {};  // rows x columns 0..7 (rows 0..7's diagonal), rows x 8..15 (rows 8..15's)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int panel = 0; panel < 2; ++panel) {
        uint32_t a[4], b[4];
        ldmatrix_x4_at(a, (a_first ^ (32u * ks)) + panel * kStatePanelBytes);
        ldmatrix_x4_at(b, (b_first ^ (32u * ks)) + panel * kStatePanelBytes);
        mma_16816<Elem>(diag[0], a, b[0], b[1]);
        mma_16816<Elem>(diag[1], a, b[2], b[3]);
      }
    }
    // C layout: this lane's entries (lane / 4, 2 (lane % 4) + i) and (lane / 4 + 8, ..): on the diagonal
    // where lane / 4 == 2 (lane % 4) + i
    const int r = lane / 4, c = 2 * (lane % 4);
    return r == c ? diag[0][0] + diag[1][2] : r == c + 1 ? diag[0][1] + diag[1][3] : 0.f;
  }

  // dgamma, then dg = reverse cumsum of dg_s over the chunk (warp 0, two rows a lane), from the
  // per-warp partials (complete after stage E's first barrier). Called after the item's stores:
  // before them it holds back the calling warp's share and its group's barrier.
  static __device__ void store_dg(const BackwardParams& bp, const SharedStorage& s, const Item& it, float gamma) {
    const int lane = threadIdx.x % 32;
    float dot = 0.f, ka = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      dot += s.state_dot_part[w];
      ka += s.ka_part[w];
    }
    float dgs_row[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 2 * lane + i;
      float x = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) x += s.dgs_part[w][row];
      if (row == kChunk - 1) x += exp2_approx(gamma) * dot + ka;
      dgs_row[i] = x;
    }
    float suffix = dgs_row[0] + dgs_row[1];  // lane l: rows 2 l, 2 l + 1
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const float down = __shfl_down_sync(0xffffffffu, suffix, offset);
      if (lane + offset < 32) suffix += down;
    }
    const float dg_row[2] = {suffix, suffix - dgs_row[0]};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 2 * lane + i;
      if (row < it.rows)
        bp.dg[it.b * bp.dg_strides.batch + (it.t0 + row) * bp.dg_strides.token + it.h * bp.dg_strides.head] = dg_row[i];
    }
  }
  // dbeta (warp 1 beside warp 0's dg, two rows a lane): its column terms (stage C) and row terms
  // (stage D) over the 8 warps' partials.
  static __device__ void store_dbeta(const BackwardParams& bp, const SharedStorage& s, const Item& it) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 2 * lane + i;
      float y = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) y += s.dbeta_col[w][row] + s.dbeta_row[w][row];
      if (row < it.rows) {
        const int64_t off =
            it.b * bp.dbeta_strides.batch + (it.t0 + row) * bp.dbeta_strides.token + it.h * bp.dbeta_strides.head;
        if (bp.fwd.beta_is_bf16)
          static_cast<__nv_bfloat16*>(bp.dbeta)[off] = __float2bfloat16_rn(y);
        else
          static_cast<float*>(bp.dbeta)[off] = y;
      }
    }
  }

  static __device__ void run(const BackwardParams& bp, const BackwardTileMaps& maps) {
    extern __shared__ __align__(1024) unsigned char smem_grads[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_grads);
    const ForwardParams& p = bp.fwd;
    const int group = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    if (threadIdx.x == kIssuer) {
      tma::barrier_init(&s.early, 1);
      tma::barrier_init(&s.state, 1);
      tma::barrier_init(&s.late, 1);
      tma::barrier_init(&s.ag_set, 1);
      tma::barrier_init(&s.partial, 1);
      tma::barrier_init(&s.partial_dk, 1);
      tma::fence_barrier_init();
      s.next = find_item(bp, first_index(bp), Item{});
      if (s.next.valid) {
        issue_early(p, maps, s, s.next);
        issue_state(p, maps, s, s.next);
        issue_late(p, maps, s, s.next);
        issue_ag(maps, s, s.next);
      }
      s.after = item_after(bp, s.next);  // behind the first item's loads
    }
    __syncthreads();
    const Item first = s.next;
    if (!first.valid) return;
    Acc32 a_r;  // A_r of the item, loaded an item ahead
    load_inverse(p, first, group, a_r);
    const StorageWord sw{static_cast<uint32_t>(wg::encode(smem_addr(smem_grads))), smem_grads};
#pragma unroll 1
    do {
      float* const running_sum = run_item(bp, maps, s, sw, a_r);
      __syncthreads();  // warps 0, 1's reads of the partials before the next item zeroes them; the staged sum complete
      if (running_sum != nullptr && threadIdx.x == kIssuer) store_running_sum(s, running_sum);
    } while (s.next.valid);
    if (threadIdx.x % 128 == 0) tma::wait_bulk_read<0>();  // shared memory stays until the last store has read it
  }

  // The item in s.next: its stages; on the way, the next item (looked up under the previous item's
  // stage E, s.after) goes to s.next (after stage C), its three load sets are issued (after stage C,
  // after stage D and after stage E's wgmmas), its A_r is loaded into a_r and the item after it looked
  // up into s.after (under E's wgmmas).
  // Returns the unit's running sum in HBM where this item staged it for run() to store, else null.
  static __device__ __forceinline__ float* run_item(const BackwardParams& bp, const BackwardTileMaps& maps,
                                                    SharedStorage& s, const StorageWord& sw, Acc32& a_r) {
    const Item it = s.next;
    const ForwardParams& p = bp.fwd;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    timeline_mark(p, group, it.ordinal, 0);
    const float scale = p.scale;
    const int64_t b = it.b, t0 = it.t0;
    const int rows = it.rows, h = it.h;
    const int group_rank = it.group_rank;  // the v-head's place in its group
    const bool add_partial = bp.group_sums && group_rank > 0;
    const bool pass_partial = bp.group_sums && !it.group_last;  // a running sum for the group's next v-head
    // the running sums staged so far (each mbarrier's phases): every earlier unit of this CTA's (all
    // its items valid: a unit's v-heads share the chunk) staged group_size - 1, this unit group_rank - 1;
    // its parity formed where it is waited on (kept live across the item, it spilled at 255 registers)
    const auto partial_phase = [&] {
      const int group_size = p.num_v_heads / p.num_qk_heads;  // v-heads per q/k head
      return (it.ordinal / group_size * (group_size - 1) + group_rank - 1) % 2;
    };

    // ── Stage 0 ───────────────────────────────────────────────────────────────────────────────
    {  // a warp's partials cover its group's columns only: all three arrays zeroed, 16-byte units t, t + 256
      static_assert(offsetof(SharedStorage, dbeta_col) == offsetof(SharedStorage, dgs_part) + 8 * kChunk * 4 &&
                        offsetof(SharedStorage, dbeta_row) == offsetof(SharedStorage, dbeta_col) + 8 * kChunk * 4 &&
                        offsetof(SharedStorage, dgs_part) % 16 == 0 && 3 * 8 * kChunk * 4 == 16 * (kThreads + kThreads / 2),
                    "the three partial arrays back to back, 1.5 16-byte units a thread");
      uint4* const partials = reinterpret_cast<uint4*>(&s.dgs_part[0][0]) + threadIdx.x;
      partials[0] = make_uint4(0, 0, 0, 0);
      if (threadIdx.x < kThreads / 2) partials[kThreads] = make_uint4(0, 0, 0, 0);
    }
    // a sequence's last chunk: <dS_T, S> from the pre-pass (8 partial sums), fetched now, kept in
    // shared memory for the end (stage A forms every other chunk's there); a branch, not a select:
    // the other lanes and warps skip the load's address math
    const bool from_prepass = warp == 0 && lane < 8 && prepass_dot(bp, it);
    float prepass_dot_part = 0.f;
    if (from_prepass) prepass_dot_part = p.final_grad_dots[it.index * 8 + lane];
    unpack_inverse(p, group, a_r);  // its loads were issued an item ahead
    store_panel<32>(s.ar, 4 * group, [&](int j, int e) { return a_r[4 * j + e]; });
    tma::wait(&s.early, it.ordinal % 2);
    // the gate record from the early set's landing slot into gcum, beta (read after stage 0's barrier)
    if (threadIdx.x < 2 * kChunk / 4)
      reinterpret_cast<float4*>(s.gcum)[threadIdx.x] = reinterpret_cast<const float4*>(s.gates_in)[threadIdx.x];
    tma::wait(&s.state, it.ordinal % 2);
    tma::wait(&s.late, it.ordinal % 2);
    timeline_mark(p, group, it.ordinal, 1);
    if (from_prepass) s.state_dot_part[lane] = prepass_dot_part;
    if (rows < kChunk) zero_rows(s, rows, it.keep_qk);
    wg::fence_shared_to_async();  // A_r's tile and the zeroed rows, for the wgmmas
    __syncthreads();
    const float gamma = s.gcum[kChunk - 1];
    const float row_gate[2] = {s.gcum[acc_row(0)], s.gcum[acc_row(2)]};

    // ── Stage A: U, W; P, Pg ───────────────────────────────────────────────────────────────────
    Acc32 qk;  // P = Q K^T, columns 32 g .., kept for C
    // G (.) lower mask (i >= j) at qk's positions, formed here for Pg and kept for stage C's dP, dA_r
    // (the same positions: dPg, dAg are m64n32 over columns 32 g ..)
    Acc32 gate;
    {
      Acc u;
      wg::fence();
      mma_pinned<64, Major::kK, Major::kK, kHeadDim>(u, sw, s.k, kChunk, s.st + 64 * group * 128, kHeadDim, false);
      mma_pinned<32, Major::kK, Major::kK, kHeadDim>(qk, sw, s.q, kChunk, s.k + 32 * group * 128, kChunk, false);
      wg::commit();
      if (!prepass_dot(bp, it)) {  // under the wgmmas, which only read the tiles too
        const float dot = warp_sum(state_dot(s));
        if (lane == 0) s.state_dot_part[warp] = dot;
      }
      wg::wait<0>();
      wg::fence_operand(u);
      wg::fence_operand(qk);
      {  // W = V - Gamma U over V's panel g (each thread rewrites its own accumulator positions)
        const float decay[2] = {exp2_approx(row_gate[0]), exp2_approx(row_gate[1])};
        unsigned char* panel = s.v + group * kPanelBytes;
        for_panel_pairs<64>(panel, 0, [&](int j, int e, float2 x) {
          u[4 * j + e] = x.x - decay[e / 2] * u[4 * j + e];
          u[4 * j + e + 1] = x.y - decay[e / 2] * u[4 * j + e + 1];
        });
        __syncwarp();  // every lane's reads before the writes (ldmatrix rows are shared across lanes)
        store_panel<64>(panel, 0, [&](int j, int e) { return u[4 * j + e]; });
      }
      // G formed at every position, then selected: unconditional, the gates' loads merge (LDS.128) and
      // ptxas stops reloading the scale per predicated element (LDC). s G (.) P needs no select of its
      // own: G is zero above the diagonal (P is finite)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = acc_row(e), col = 32 * group + acc_col(j, e);
          const float g = exp2_approx(row_gate[e / 2] - s.gcum[col]);
          gate[4 * j + e] = row >= col ? g : 0.f;
        }
      store_panel<32>(s.pg, 4 * group, [&](int j, int e) { return scale * gate[4 * j + e] * qk[4 * j + e]; });
    }
    wg::fence_shared_to_async();
    // the previous item's running sum (the issuer) and dq, dk panels (TMA, each group's first thread)
    // read out of Vd, dVd, dU, dA_r, dP
    if (threadIdx.x % 128 == 0) tma::wait_bulk_read<0>();
    __syncthreads();
    timeline_mark(p, group, it.ordinal, 2);

    // ── Stage B: Vd, dVd, a ────────────────────────────────────────────────────────────────────
    // Ag (its own load set, issued with the late set; first read here) and, for a partial chunk, its
    // rows past the end zeroed (rows is the CTA's: the barrier is uniform)
    tma::wait(&s.ag_set, it.ordinal % 2);
    if (rows < kChunk) {
      zero_ag_rows(s, rows);
      wg::fence_shared_to_async();
      __syncthreads();
    }
    float* dgs = s.dgs_part[warp];
    {
      Acc vd, kds, pdo;  // one round: Vd, K dS and Pg^T dO in separate accumulators
      wg::fence();
      mma_opaque<64, Major::kK, Major::kMN, kChunk>(vd, sw, s.ag, kChunk, s.v + group * kPanelBytes, kChunk, false);
      mma_opaque<64, Major::kK, Major::kK, kHeadDim>(kds, sw, s.k, kChunk,
                                                             s.dst + 64 * group * 128, kHeadDim, false);
      mma_opaque<64, Major::kMN, Major::kMN, kChunk>(pdo, sw, s.pg, kChunk,
                                                             s.d_o + group * kPanelBytes, kChunk, false);
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(vd);
      wg::fence_operand(kds);
      wg::fence_operand(pdo);
      Tiles::store_fragments(s.vd + group * kPanelBytes, 0, [&](int j, int e) { return vd[4 * j + e]; });
      const float rho[2] = {exp2_approx(gamma - row_gate[0]), exp2_approx(gamma - row_gate[1])};
      Tiles::store_fragments(s.dvd + group * kPanelBytes, 0,
                             [&](int j, int e) { return rho[e / 2] * kds[4 * j + e] + pdo[4 * j + e]; });
      // a = rowsum(K (.) dK_a) = rho (.) rowsum((K dS) (.) Vd), from the fp32 accumulators: dK_a's
      // wgmma (stage C) takes Vd in bf16, and that rounding of a sequence's last chunk reaches dg_T
      // whole (a random-signed sum of the user's dht, bench/dg_error_locate.py).
      float ka_row[2] = {0.f, 0.f};
#pragma unroll
      for (int x = 0; x < 32; ++x) ka_row[(x % 4) / 2] += kds[x] * vd[x];
#pragma unroll
      for (int half = 0; half < 2; ++half) ka_row[half] *= -rho[half];  // -a
      add_row_sums(dgs, ka_row);
      const float ka = -warp_sum(ka_row[0] + ka_row[1]);
      if (lane == 0) s.ka_part[warp] = ka;
    }
    wg::fence_shared_to_async();
    __syncthreads();
    timeline_mark(p, group, it.ordinal, 3);

    // ── Stage C: dW -> dv, dU; dPg, dAg -> dP, dA_r, E, dbeta; dQ_a, dK_a ─────────────────────
    Acc dq, dk;  // dQ_a, dK_a over columns 64 g .., then dq, dk: in flight under the first group's epilogue
    // dg_s's row terms of this thread's rows (as add_row_sums) from stage C's on, summed in registers
    // to stage D's end, then added to dgs once
    float row_dg[2];  // from stage C's first energy term on (no add to a zero)
    {
      Acc dw;
      Acc32 dpg, dag;
      wg::fence();
      mma_pinned<64, Major::kMN, Major::kMN, kChunk>(dw, sw, s.ag, kChunk,
                                                             s.dvd + group * kPanelBytes, kChunk, false);
      {
        const uint64_t d_o = pinned_descriptor<Major::kK>(sw, s.d_o, kChunk);
        const uint64_t vd = pinned_descriptor<Major::kK>(sw, s.vd + 32 * group * 128, kChunk);
        const uint64_t dvd = pinned_descriptor<Major::kK>(sw, s.dvd, kChunk);
        const uint64_t v = pinned_descriptor<Major::kK>(sw, s.v + 32 * group * 128, kChunk);
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
          wg::mma_ss<Elem, 32, Major::kK, Major::kK>(dpg, wg::k_step<Major::kK>(d_o, k0, kChunk),
                                                     wg::k_step<Major::kK>(vd, k0, kChunk), k0 > 0);
          wg::mma_ss<Elem, 32, Major::kK, Major::kK>(dag, wg::k_step<Major::kK>(dvd, k0, kChunk),
                                                     wg::k_step<Major::kK>(v, k0, kChunk), k0 > 0);
        }
      }
      wg::commit();
      {
        const uint64_t d_o = pinned_descriptor<Major::kK>(sw, s.d_o, kChunk);
        const uint64_t st = pinned_descriptor<Major::kMN>(sw, s.st + group * kStatePanelBytes, kHeadDim);
        const uint64_t vd = pinned_descriptor<Major::kK>(sw, s.vd, kChunk);
        const uint64_t dst = pinned_descriptor<Major::kMN>(sw, s.dst + group * kStatePanelBytes, kHeadDim);
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
          wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(dq, wg::k_step<Major::kK>(d_o, k0, kChunk),
                                                      wg::k_step<Major::kMN>(st, k0, kHeadDim), k0 > 0);
          wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(dk, wg::k_step<Major::kK>(vd, k0, kChunk),
                                                      wg::k_step<Major::kMN>(dst, k0, kHeadDim), k0 > 0);
        }
      }
      wg::commit();
      wg::wait<1>();  // dW, dPg, dAg done; dQ_a, dK_a still running
      timeline_mark(p, group, it.ordinal, 4);
      wg::fence_operand(dw);
      wg::fence_operand(dpg);
      wg::fence_operand(dag);
      // dv = dW (valid rows) staged in dU's panel g (free since the previous item's running sum was read
      // out before stage B), then 16-byte row pieces; the staged bf16 dW is also stage D's dU S^T operand
      // (dU = -Gamma dW: the rows' -e^g applied to that product's fp32 rows, not to a dU tile)
      unsigned char* dv_panel = s.du + group * kPanelBytes;
      store_panel<64>(dv_panel, 0, [&](int j, int e) { return dw[4 * j + e]; });
      const bool tma_out = maps.tma_outputs && rows == kChunk;  // store_output's panels, else copy_rows
      if (tma_out) wg::fence_shared_to_async();
      group_sync(group);
      if (tma_out) {
        store_output(&maps.dv, dv_panel, group, h, it);
        if (threadIdx.x % 128 == 0) tma::commit_bulk();
      } else {
        copy_rows(bp.dv, bp.dv_strides, group, h, b, t0, dv_panel, rows);
      }
      // dP, dA_r, E and dbeta's column terms over columns 32 g ..; column_quad_sum's sums go to dg_s
      // (lanes 0..15: -colsum(E)) and dbeta (16..: colsum(dAg (.) G (.) A_r))
      static_assert(offsetof(SharedStorage, dbeta_col) == offsetof(SharedStorage, dgs_part) + 8 * kChunk * 4,
                    "a warp's dbeta column partials 8 rows of partials after its dg_s ones");
      float* const col_dst = dgs + (lane >= 16 ? 8 * kChunk : 0) + 32 * group + acc_col(0, 0) + lane / 8 % 2;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // -E, dAg G A_r at columns col0 + d, both row halves: set by the first row half's terms, not
        // added to zeros (0 - x is not -x to ptxas, whose signed zeros then cost an FADD)
        float col_sum[2][2];
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int row = acc_row(e), col = 32 * group + acc_col(j, e);
          float dp[2], dar[2];
#pragma unroll
          for (int d = 0; d < 2; ++d) {
            const int x = 4 * j + e + d;
            dp[d] = scale * gate[x] * dpg[x];
            const float t = dag[x] * gate[x];  // dAg (.) G
            dar[d] = t * s.beta[col + d];
            const float energy = dp[d] * qk[x] + dar[d] * a_r[x];  // Pg dPg + Ag dAg
            row_dg[e / 2] = j == 0 && d == 0 ? energy : row_dg[e / 2] + energy;
            col_sum[0][d] = e == 0 ? -energy : col_sum[0][d] - energy;
            col_sum[1][d] = e == 0 ? t * a_r[x] : col_sum[1][d] + t * a_r[x];
          }
          dpg[4 * j + e] = dp[0], dpg[4 * j + e + 1] = dp[1];  // dPg's registers now hold dP
          dag[4 * j + e] = dar[0], dag[4 * j + e + 1] = dar[1];  // dAg's registers now hold dA_r
        }
        // this j's column terms over the warp's 16 rows (each (array, column) added by one lane: no
        // other lane of the warp touches it before the next barrier)
        const float col_term = column_quad_sum(col_sum);
        if (lane % 8 < 4) col_dst[8 * j] += col_term;
      }
      store_panel<32>(s.dp, 4 * group, [&](int j, int e) { return dpg[4 * j + e]; });
      store_panel<32>(s.dar, 4 * group, [&](int j, int e) { return dag[4 * j + e]; });
    }
    {
      wg::wait<0>();
      wg::fence_operand(dq);
      wg::fence_operand(dk);
      const float qf[2] = {scale * exp2_approx(row_gate[0]), scale * exp2_approx(row_gate[1])};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[4 * j + e] *= qf[e / 2];  // dK_a's rho: at stage E's sum
      __syncwarp();
      add_row_dots(row_dg, dq, s.q + group * kPanelBytes);  // dg_s's dK_a term is stage B's a
    }
    wg::fence_shared_to_async();
    __syncthreads();
    timeline_mark(p, group, it.ordinal, 5);
    if (threadIdx.x == kIssuer) {  // V, dO, dS^T are free (moved under X, the issue spills at 255 registers)
      Item next = s.after;  // looked up under the previous item's stage E wgmmas
      next.ordinal = it.ordinal + 1;
      // K, Q stay (the late set loads nothing) where next is this item's unit's next v-head: the same
      // chunk and q/k head are the same bytes (nothing but TMA and zero_rows writes K, Q). Set here
      // for every item: find_item copies the fields of the item it walked from.
      next.keep_qk = next.valid && next.chunk_id == it.chunk_id && next.hk == it.hk;
      s.next = next;
      if (add_partial) {  // Vd, dVd are retired; ahead of the 64 KiB early set
        tma::wait_bulk<0>();  // the previous item's store of the running sum complete in HBM (long done by now)
        issue_partial_dq(bp, s, it);
      }
      // the lines of the next lookup (from next's sequence, at this item's end) into L1, after
      // wait_bulk's L1 invalidation (CCTL.IVALL)
      if (next.valid) prefetch_chunk_lookup(p, next.seq);
      if (next.valid) issue_early(p, maps, s, next);
    }

    // ── Stage D: X; Y, KK -> dL, dbeta, dM ─────────────────────────────────────────────────────
    Acc dk_rest;  // dU S^T (issued with X), then + dP^T Q + dM K + dM^T K (stage E)
    {
      Fragments x_frag[4];  // X = A_r^T dA_r [64, 64], whole in each group: Y's A operand
      {
        Acc x;
        wg::fence();
        mma_opaque<64, Major::kMN, Major::kMN, kChunk>(x, sw, s.ar, kChunk, s.dar, kChunk, false);
        wg::commit();
        issue_first_terms(s, sw, group, dq, dk_rest);  // behind X: they need nothing from D
        wg::commit();
        wg::wait<1>();
        wg::fence_operand(x);
        wg::to_fragments<Elem, 4>(x, x_frag);
      }
      Acc32 y, kk;
      wg::fence();
      {
        const uint64_t ar = opaque_descriptor<Major::kK>(sw, s.ar + 32 * group * 128, kChunk);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wg::mma_rs<Elem, 32, Major::kK>(y, x_frag[ks], wg::k_step<Major::kK>(ar, 16 * ks, kChunk), ks > 0);
      }
      mma_opaque<32, Major::kK, Major::kK, kHeadDim>(kk, sw, s.k, kChunk, s.k + 32 * group * 128, kChunk, false);
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(y);
      wg::fence_operand(kk);
      wg::fence_operand(dq);
      wg::fence_operand(dk_rest);
      {  // dU S^T = -Gamma (dW S^T): the rows' -e^g from the gate record (not kept in registers since stage A)
        const float neg_decay[2] = {-exp2_approx(s.gcum[acc_row(0)]), -exp2_approx(s.gcum[acc_row(2)])};
#pragma unroll
        for (int x = 0; x < 32; ++x) dk_rest[x] *= neg_decay[(x % 4) / 2];
      }
      float row_beta[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = acc_row(e), col = 32 * group + acc_col(j, e);
          const float dl = row > col ? -y[4 * j + e] : 0.f;
          row_beta[e / 2] += dl * kk[4 * j + e];
          y[4 * j + e] = s.beta[row] * dl;  // dM = diag(beta) dL, strictly lower
        }
      store_panel<32>(s.ag, 4 * group, [&](int j, int e) { return y[4 * j + e]; });
      add_row_sums(s.dbeta_row[warp], row_beta);
      add_row_dots(row_dg, dk_rest, s.k + group * kPanelBytes);  // rowsum(K (.) dU S^T)
      add_row_sums(dgs, row_dg);
    }
    wg::fence_shared_to_async();
    __syncthreads();
    // S^T's last readers (E's first terms) are done: the next item's S^T loads under stage E
    if (threadIdx.x == kIssuer && s.next.valid) issue_state(p, maps, s, s.next);
    if (add_partial) {  // the group's running dq sum into dq (complete: no stage-E term is left)
      if (threadIdx.x == kIssuer) issue_partial_dk_head(bp, s, it);  // A_r, Pg, dA_r are retired
      tma::wait(&s.partial, partial_phase());
      add_staged_partial(s, false, group, dq);
      __syncthreads();  // every read of the staged dq done
      if (threadIdx.x == kIssuer) issue_partial_dk_tail(bp, s, it);
    }
    timeline_mark(p, group, it.ordinal, 6);

    // ── Stage E: dq, dk ───────────────────────────────────────────────────────────────────────
    {
      wg::fence();
      {
        const uint64_t dp = opaque_descriptor<Major::kMN>(sw, s.dp, kChunk);
        const uint64_t q = opaque_descriptor<Major::kMN>(sw, s.q + group * kPanelBytes, kChunk);
        const uint64_t dm = opaque_descriptor<Major::kK>(sw, s.ag, kChunk);
        const uint64_t dm_t = opaque_descriptor<Major::kMN>(sw, s.ag, kChunk);
        const uint64_t k = opaque_descriptor<Major::kMN>(sw, s.k + group * kPanelBytes, kChunk);
#pragma unroll
        for (int k0 = 0; k0 < kChunk; k0 += 16) {
          wg::mma_ss<Elem, 64, Major::kMN, Major::kMN>(dk_rest, wg::k_step<Major::kMN>(dp, k0, kChunk),
                                                       wg::k_step<Major::kMN>(q, k0, kChunk), true);
          wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(dk_rest, wg::k_step<Major::kK>(dm, k0, kChunk),
                                                      wg::k_step<Major::kMN>(k, k0, kChunk), true);  // dM K
          wg::mma_ss<Elem, 64, Major::kMN, Major::kMN>(dk_rest, wg::k_step<Major::kMN>(dm_t, k0, kChunk),
                                                       wg::k_step<Major::kMN>(k, k0, kChunk), true);  // dM^T K
        }
      }
      wg::commit();
      {  // the next item's A_r into a_r (its last reader was stage C's epilogue), issued under these
         // wgmmas: no fence.proxy.async (a MEMBAR, which waits for this thread's loads) or wgmma fence
         // comes before its first use at the next item's top, but for a running sum's staging
        const Item& next = s.next;  // its fields read where used (the lookup reads the rest)
        if (next.valid) load_inverse(p, next, group, a_r);
        // the item after next, looked up under the wgmmas too (its issuer's wait; the other warps
        // wait for it at this stage's barrier, not at the item's end)
        if (threadIdx.x == kIssuer) {
          s.after = item_after(bp, next);
          timeline_mark(p, 1, it.ordinal, 11);
        }
      }
      wg::wait<0>();
      wg::fence_operand(dq);
      wg::fence_operand(dk);
      wg::fence_operand(dk_rest);
      timeline_mark(p, group, it.ordinal, 7);
      // dK_a's factor rho from the gate record, not kept in registers since stage C (4 bytes spilled at
      // 255 registers); gcum is rewritten only at the next item's stage 0 (the next record is in gates_in)
      const float rho[2] = {exp2_approx(gamma - s.gcum[acc_row(0)]), exp2_approx(gamma - s.gcum[acc_row(2)])};
      if (threadIdx.x % 128 == 0) tma::wait_bulk_read<0>();  // dv's TMA store has read dU's panel (restaged below)
      __syncthreads();  // every read of K, Q, S^T and dM (Ag's bytes) done; the dg_s partials complete
      if (threadIdx.x == kIssuer && s.next.valid) {
        issue_late(p, maps, s, s.next);
        issue_ag(maps, s, s.next);  // dM's last reader was stage E's wgmmas
      }
#pragma unroll
      for (int x = 0; x < 32; ++x) dk[x] = fmaf(rho[(x % 4) / 2], dk[x], dk_rest[x]);  // dK_a = rho (.) (Vd dS^T)
    }
    if (add_partial) {  // the group's running dk sum
      tma::wait(&s.partial_dk, partial_phase());
      timeline_mark(p, group, it.ordinal, 8);
      add_staged_partial(s, true, group, dk);
    }
    if (pass_partial) {
      // The running sum for the group's next v-head, staged for run()'s bulk store: dq in Vd, dVd
      // (rows 48..63 where this thread read dk's rows 48..63); dk's rows 0..31 in dU, 32..47 in place
      // in dA_r, 48..63 in dP.
      {
        const int row = acc_row(0);  // and row + 8: one side of row 32
        const uint32_t base = partial_row_base(row, group);
        // dk's rows 32.. at row - 32 of dA_r, dP: row % 4 is unchanged, so the offset is base's less 32
        // rows (subtracted from the offset, which stays in the tile: the pointer is formed in range)
        const bool dk_low = row < kChunk / 2;
        unsigned char* const dk_tile = dk_low ? s.du : s.dar;
        const uint32_t dk_shift = dk_low ? 0u : kChunk / 2 * kHeadDim * 4;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int half_off = (e / 2) * 8 * kHeadDim * 4;
            *reinterpret_cast<float2*>(s.vd + partial_byte_offset(base, j) + half_off) =
                make_float2(dq[4 * j + e], dq[4 * j + e + 1]);
            *reinterpret_cast<float2*>(dk_tile + (partial_byte_offset(base, j) + half_off - dk_shift)) =
                make_float2(dk[4 * j + e], dk[4 * j + e + 1]);
          }
      }
      wg::fence_shared_to_async();  // for the bulk store after run()'s barrier
    } else if (bp.direct_qk || bp.group_sums) {
      // dq, dk in q's dtype (h is its own q/k head, or the group's last v-head writes the sums):
      // panel g staged in dU (dq) and Vd's first half (dk), then written in 16-byte row pieces (no
      // staged sum is left there: dq's was added at stage D's end, dk's lies in A_r .. dA_r and dVd).
      unsigned char* dq_panel = s.du + group * kPanelBytes;
      unsigned char* dk_panel = s.vd + group * kPanelBytes;
      store_panel<64>(dq_panel, 0, [&](int j, int e) { return dq[4 * j + e]; });
      store_panel<64>(dk_panel, 0, [&](int j, int e) { return dk[4 * j + e]; });
      const bool tma_out = maps.tma_outputs && rows == kChunk;
      if (tma_out) wg::fence_shared_to_async();
      group_sync(group);
      const int head = bp.direct_qk ? h : it.hk;
      if (tma_out) {
        store_output(&maps.dq, dq_panel, group, head, it);
        store_output(&maps.dk, dk_panel, group, head, it);
        if (threadIdx.x % 128 == 0) tma::commit_bulk();
      } else {
        copy_rows(bp.dq, bp.dq_strides, group, head, b, t0, dq_panel, rows);
        copy_rows(bp.dk, bp.dk_strides, group, head, b, t0, dk_panel, rows);
      }
    } else {  // every v-head's dq, dk in fp32, summed by qk_grads (a row's pointer once, its columns by immediates)
      const int64_t first = ((b * p.seqlen + t0 + acc_row(0)) * p.num_v_heads + h) * kHeadDim + 64 * group + acc_col(0, 0);
      const int64_t row8 = 8 * static_cast<int64_t>(p.num_v_heads) * kHeadDim;  // row + 8
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        if (acc_row(e) >= rows) continue;
        float* const dq_row = bp.dq_heads + first + (e / 2) * row8;
        float* const dk_row = bp.dk_heads + first + (e / 2) * row8;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *reinterpret_cast<float2*>(dq_row + 8 * j) = make_float2(dq[4 * j + e], dq[4 * j + e + 1]);
          *reinterpret_cast<float2*>(dk_row + 8 * j) = make_float2(dk[4 * j + e], dk[4 * j + e + 1]);
        }
      }
    }
    timeline_mark(p, group, it.ordinal, 9);
    if (warp == 0) store_dg(bp, s, it, gamma);
    if (warp == 1) store_dbeta(bp, s, it);

    timeline_mark(p, group, it.ordinal, 10);
    return pass_partial ? unit_partial(bp, it) : nullptr;
  }
};

template <typename Elem>
__global__ void __launch_bounds__(256, 1) backward_grads_kernel(const __grid_constant__ BackwardParams bp,
                                                                const __grid_constant__ BackwardTileMaps maps) {
  wait_for_previous_grid();
  release_next_grid();
  BackwardGrads<Elem>::run(bp, maps);
}

}  // namespace flashgdn::kern
