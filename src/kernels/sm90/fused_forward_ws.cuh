// Fused chunked forward, warp-specialized (v3, sm_90a; FusedKernel::kWarpSpecialized): the work
// items, outputs and checkpoints of fused_forward_wg.cuh, with the chunk recurrence in the WY form,
// so that one product per chunk reaches the state before Vd:
//
//   Vd = Ag V - W~ S,   W~ = B~ K,   B~ = Gamma A_r diag(beta)
//        (fused_forward_wg's Ag W with W = V - Gamma K S expanded: Ag Gamma = Gamma A_r diag(beta),
//         entry (i, t) = e^{g_i - g_t} A_r[i,t] beta_t e^{g_t})
//   O  = scale (Gamma Q S + P Vd),   S' = e^gamma S + K^T (rho (.) Vd)
//
// Everything but the products with S is independent of S; one warpgroup makes it a chunk ahead.
//
// Grid (N sequences or segments, Hv[, 2 for the CP state pass]); block 384 threads = 3 warpgroups.
//   aux   (warpgroup 0; setmaxnreg 136): per chunk c, into slot c % 2 once the state groups have
//         released it (after chunk c - 2): K, Q (with o) and V by cp.async, the gates (warp 0), A_r
//         from HBM straight into registers in the wgmma A-fragment layout; then
//           P   [64,64]  = G (.) (Q @ K^T)                SS wgmma, 8 x m64n64k16    -> slot.p
//           Ag  [64,64]  = G (.) A_r (.) 1 beta^T          registers, stmatrix        -> slot.ag
//           -W~ [64,128] = (-B~) @ K                       RS wgmma, 2 x 4 x m64n64k16 -> slot.w_neg
//         and arrives on ready[c % 2].
//   state (warpgroups 1, 2 = groups g 0, 1; setmaxnreg 184): value columns n = 64 g .. 64 g + 63 of
//         S, in fp32 registers for the whole item with a bf16 copy in panel g of `state`. Per chunk
//         c, after ready[c % 2]:
//           Vd [64,64] = Ag @ V[:, n] + (-W~) @ S[:, n]     4 + 8 wgmma, one accumulator
//           QS [64,64] = Q @ S[:, n]                        8 (o only)
//             (chunk c-1's o leaves the Vd panel for HBM under these wgmmas)
//           Vd -> vd, rho (.) Vd -> vd_decayed, QS rows *= Gamma            -> group barrier
//           O = QS + P @ Vd[:, n] (4, o only);  S = e^gamma S + K^T @ (rho Vd)[:, n] (8)
//           free[c % 2] (the slot is read); o -> the Vd panel; S -> its panel -> group barrier
//         The two state groups never wait for each other.
// Shared memory (226 KiB): slots [2] of {k, q, v, w_neg [64][128]; p, ag [64][64]} (80 KiB each,
// 128B-swizzled panels as in wgmma.cuh); state [128][128]; vd, vd_decayed [64][128]; gcum, beta
// [2][64] fp32 (gcum in log2 units); mbarriers ready[2] (128 arrivals: the aux group) and free[2]
// (256: the state groups). Named barriers: 1 the aux group, 2 + g state group g.
#pragma once

#include <type_traits>
#include <utility>

#include "kernels/sm90/fused_forward_wg.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/timeline.cuh"
#include "kernels/sm90/tma.cuh"

namespace flashgdn::kern {

// The entry of the warp-specialized forwards (v3 here, v4 in fused_forward_rs.cuh): the ring's
// barriers, then warpgroup 0 gives registers up to kAux and runs aux(with_o, hk, h), warpgroups 1
// and 2 take kState and run state(with_o, h, group). with_o: the pass writes o (not the CP state
// pass); it and the role are made visibly warp-uniform (see fused_forward_wg.cuh). Whether the CTA has an
// item and writes o: the roles look their item up themselves (block_work_item: under the sequence order,
// grid (1, Hv, N), sequence_order[blockIdx.z]); here every item is valid and writes o (where p.o is
// given) without CP, so the natural index serves as well, and the one or the other lookup is a matter of
// registers only: with kBlockItem (v4) block_work_item's, else (v3, v5) the natural one (ptxas, bf16:
// v4's state groups spilled 56 bytes with the natural lookup, v5 32 with block_work_item's).
template <int kAux, int kState, bool kBlockItem = false, typename Storage, typename Aux, typename State>
__device__ __forceinline__ void run_roles(const ForwardParams& p, Storage& s, Aux&& aux, State&& state) {
  const int h = blockIdx.y;
  const WorkItem item = kBlockItem ? block_work_item(p) : work_item(p, blockIdx.x, h, blockIdx.z);
  if (!item.valid) return;
  if (threadIdx.x == 0) tma::init_ring(s.ready, s.free, 128, 256);
  __syncthreads();
  const bool with_o = __shfl_sync(0xffffffffu, item.write_o ? 1 : 0, 0) != 0;
  const int role = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kAux));
    aux(with_o, h / (p.num_v_heads / p.num_qk_heads), h);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kState));
    state(with_o, h, role - 1);
  }
}

template <typename Elem, typename InverseT>
struct FusedForwardWs {
  using Tiles = FusedForwardWg<Elem, InverseT>;  // accumulator coordinates, stmatrix epilogues, o copy
  static constexpr int kThreads = 384;
  static constexpr int kAuxRegisters = 136, kStateRegisters = 184;  // 136 + 2 x 184 = 504 per lane
  static constexpr int kAuxBarrier = 1;
  static constexpr int kTokenTileBytes = Tiles::kTokenTileBytes;
  static constexpr int kPanelBytes = Tiles::kPanelBytes;
  static constexpr int kStatePanelBytes = Tiles::kStatePanelBytes;
  using Major = wg::Major;
  using Acc = float[32];
  using InversePair = std::conditional_t<std::is_same_v<InverseT, float>, float2, __nv_bfloat162>;

  struct Slot {
    alignas(1024) unsigned char k[kTokenTileBytes];
    alignas(1024) unsigned char q[kTokenTileBytes];
    alignas(1024) unsigned char v[kTokenTileBytes];
    alignas(1024) unsigned char w_neg[kTokenTileBytes];
    alignas(1024) unsigned char p[Tiles::kSquareTileBytes];
    alignas(1024) unsigned char ag[Tiles::kSquareTileBytes];
  };
  struct SharedStorage {
    Slot slot[2];
    alignas(1024) unsigned char state[Tiles::kStateTileBytes];
    alignas(1024) unsigned char vd[kTokenTileBytes];
    alignas(1024) unsigned char vd_decayed[kTokenTileBytes];
    alignas(16) float gcum[2][kChunk];
    alignas(16) float beta[2][kChunk];
    alignas(8) uint64_t ready[2];
    alignas(8) uint64_t free[2];
  };

  static_assert(sizeof(SharedStorage) <= 232448, "above the 227 KiB of shared memory a block may opt in to");

  static __device__ __forceinline__ void group_sync(int barrier) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
  }
  static __device__ __forceinline__ int chunk_rows(const WorkItem& item, int64_t c) {
    const int64_t left = item.eos - (item.bos + c * kChunk);
    return static_cast<int>(left < kChunk ? left : kChunk);
  }
  static __device__ __forceinline__ InversePair zero_pair() {
    if constexpr (std::is_same_v<InverseT, float>) {
      return make_float2(0.f, 0.f);
    } else {
      return __floats2bfloat162_rn(0.f, 0.f);
    }
  }
  static __device__ __forceinline__ float2 to_float2(float2 x) { return x; }
  static __device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }

  // ---- aux group ------------------------------------------------------------------------------

  // K, Q (with o) and V rows of the chunk into a slot (cp.async, one commit group; rows past the
  // chunk and V under zero_v are zero-filled): thread t of the group copies 16-byte vector t % 16
  // of rows t / 16 + 8 j.
  static __device__ void load_tiles(const ForwardParams& p, Slot& slot, int64_t b, int64_t t0, int rows, int hk,
                                    int h, bool zero_v, bool with_o) {
    const int vec = threadIdx.x % 16;
    const Elem* k_rows = row_ptr<Elem>(p.k, p.k_strides, b, t0, hk) + vec * 8;
    const Elem* q_rows = row_ptr<Elem>(p.q, p.q_strides, b, t0, hk) + vec * 8;
    const Elem* v_rows = row_ptr<Elem>(p.v, p.v_strides, b, t0, h) + vec * 8;
#pragma unroll 1
    for (int row = (threadIdx.x % 128) / 16; row < kChunk; row += 8) {
      const bool in_chunk = row < rows;
      const int64_t src_row = in_chunk ? row : 0;
      const uint32_t at = wg::tile_offset(row, vec * 8, kChunk);
      cp_async_16(slot.k + at, k_rows + src_row * p.k_strides.token, in_chunk);
      if (with_o) cp_async_16(slot.q + at, q_rows + src_row * p.q_strides.token, in_chunk);
      cp_async_16(slot.v + at, v_rows + src_row * p.v_strides.token, in_chunk && !zero_v);
    }
    cp_async_commit();
  }

  // This thread's A_r entries in the A-fragment layout of the aux warp's 16-row band: k-step ks,
  // register q = rows r (+8 for q odd), columns 16 ks + c (+8 for q >= 2) and + 1, with
  // r = 16 w + lane / 4, c = 2 (lane % 4); zero past the chunk.
  static __device__ void load_inverse_fragment(const ForwardParams& p, InversePair (&a_r)[4][4], int64_t b,
                                               int64_t t0, int rows, int h) {
    const int lane = threadIdx.x % 32, r = Tiles::acc_row(0), c = 2 * (lane % 4);
    const InverseT* chunk_rows_base =
        static_cast<const InverseT*>(p.inverse) + ((b * p.seqlen + t0) * p.num_v_heads + h) * kChunk;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = r + 8 * (q % 2), col = 16 * ks + c + 8 * (q / 2);
        a_r[ks][q] = row < rows ? *reinterpret_cast<const InversePair*>(
                                      chunk_rows_base + static_cast<int64_t>(row) * p.num_v_heads * kChunk + col)
                                : zero_pair();
      }
  }

  // The values of this thread's accumulator columns 8 j + c_lane (+ 1) of a per-token array
  // (gates, betas): index 2 j (+ 1).
  static __device__ __forceinline__ void column_values(const float* values, float (&out)[16]) {
    const int c_lane = 2 * (threadIdx.x % 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 x = *reinterpret_cast<const float2*>(values + 8 * j + c_lane);
      out[2 * j] = x.x, out[2 * j + 1] = x.y;
    }
  }

  // P [64,64] = scale G (.) (Q @ K^T), lower triangle with diagonal, into slot.p (gates in log2 units:
  // this thread's rows r, r + 8 and its columns, column_values); any slot with q, k and p tiles.
  // kGated false: scale (Q @ K^T) on the lower triangle, G left out (v4's folded chunks, whose state
  // groups put it on Vd and o: FusedForwardRs::finish_chunk). kWarpCases: the epilogue specialised per
  // warp (below); v3's aux group, at 136 registers with an fp32 inverse, spills with it.
  template <bool kGated = true, bool kWarpCases = true, typename AnySlot>
  static __device__ __forceinline__ void product_p(AnySlot& slot, const float (&g_rows)[2], const float (&g_col)[16],
                                                   float scale = 1.f) {
    Acc qk;
    wg::fence();
    wg::mma_ss_k<Elem, 64, Major::kK, Major::kK, kHeadDim, true>(qk, slot.q, kChunk, slot.k, kChunk, false);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(qk);
    // Warp w's rows 16 w .. 16 w + 15 against column block j (8 columns): all on or below the diagonal
    // for j < 2 w, all above it for j > 2 w + 1, so only blocks 2 w and 2 w + 1 compare per element
    // (and the blocks above hold zeros without a product). With kWarpCases the warp index is a
    // template argument (a warp-uniform switch), so each warp's code has its blocks' cases resolved at
    // compile time; warp -1: not known, every element compared.
    const auto store = [&](auto warp) {
      constexpr int kWarp = decltype(warp)::value;
      Tiles::store_fragments(slot.p, 0, [&](int j, int e) {
        if (kWarp >= 0 && 8 * j > 16 * kWarp + 15) return 0.f;
        const bool below = (kWarp >= 0 && 8 * j + 7 < 16 * kWarp) || Tiles::acc_row(e) >= Tiles::acc_col(j, e);
        if constexpr (!kGated) return below ? scale * qk[4 * j + e] : 0.f;
        return below ? scale * exp2_approx(g_rows[e / 2] - g_col[2 * j + e % 2]) * qk[4 * j + e] : 0.f;
      });
    };
    if constexpr (kWarpCases) {
      switch ((threadIdx.x / 32) % 4) {
        case 0: store(std::integral_constant<int, 0>{}); break;
        case 1: store(std::integral_constant<int, 1>{}); break;
        case 2: store(std::integral_constant<int, 2>{}); break;
        default: store(std::integral_constant<int, 3>{}); break;
      }
    } else {
      store(std::integral_constant<int, -1>{});
    }
  }

  // -W~ [64,128] = (-B~) @ K into slot.w_neg, -B~ given as this thread's register A fragments; in
  // two 64-key halves (panel i of the K tile), so that one m64n64 accumulator is live.
  static __device__ __forceinline__ void product_w_neg(Slot& slot, const uint32_t (&b_tilde)[4][4]) {
#pragma unroll
    for (int panel = 0; panel < 2; ++panel) {
      Acc w;
      wg::fence();  // the fragment registers were just written
      const uint64_t k0 = wg::pinned_descriptor<Major::kMN>(slot.k + panel * kPanelBytes, kChunk);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma_rs<Elem, 64, Major::kMN>(w, b_tilde[ks], wg::k_step<Major::kMN>(k0, 16 * ks, kChunk), ks > 0);
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(w);
      Tiles::store_fragments(slot.w_neg + panel * kPanelBytes, 0, [&](int j, int e) { return w[4 * j + e]; });
    }
  }

  // P, Ag and -W~ of chunk c into `slot`, from its tiles, the chunk's gates gcum / beta and this
  // thread's A_r fragments (zero past the chunk's rows).
  static __device__ __forceinline__ void chunk_products(const ForwardParams& p, Slot& slot, const float* gcum,
                                                        const float* beta, const InversePair (&a_r)[4][4], int rows,
                                                        bool with_o, int64_t c) {
    const int r = Tiles::acc_row(0), c_lane = 2 * (threadIdx.x % 4);
    const float g_rows[2] = {gcum[r], gcum[r + 8]};
    float g_col[16], beta_col[16];
    column_values(gcum, g_col);
    if (with_o) product_p<true, false>(slot, g_rows, g_col);
    timeline_mark(p, 0, c, 4);

    column_values(beta, beta_col);
    // Ag (accumulator element (j, e) is fragment register q = e / 2 + 2 (j % 2) of k-step j / 2).
    Tiles::store_fragments(slot.ag, 0, [&](int j, int e) {
      const int row = Tiles::acc_row(e), col = Tiles::acc_col(j, e);
      const float2 pair = to_float2(a_r[j / 2][e / 2 + 2 * (j % 2)]);
      const float x = e % 2 == 0 ? pair.x : pair.y;
      const int at = 2 * j + e % 2;
      return row >= col && row < rows ? exp2_approx(g_rows[e / 2] - g_col[at]) * x * beta_col[at] : 0.f;
    });
    timeline_mark(p, 0, c, 5);

    // -B~ = -Gamma A_r diag(beta) (the sign here: the product needs no negation pass).
    uint32_t b_tilde[4][4];
    const float row_decay[2] = {r < rows ? -exp2_approx(g_rows[0]) : 0.f, r + 8 < rows ? -exp2_approx(g_rows[1]) : 0.f};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = r + 8 * (q % 2), col = 16 * ks + c_lane + 8 * (q / 2), at = 4 * ks + 2 * (q / 2);
        const float2 pair = to_float2(a_r[ks][q]);  // lower triangle only, as Ag (A_r has zeros above)
        b_tilde[ks][q] = pack_pair<Elem>(col <= row ? row_decay[q % 2] * pair.x * beta_col[at] : 0.f,
                                         col + 1 <= row ? row_decay[q % 2] * pair.y * beta_col[at + 1] : 0.f);
      }
    product_w_neg(slot, b_tilde);
    timeline_mark(p, 0, c, 6);
  }

  // Per chunk c: once the state groups have released slot c % 2 (after chunk c-2), one memory
  // round trip for the tiles, the gates and A_r together, then chunk_products and ready[c % 2].
  static __device__ __forceinline__ void run_aux(const ForwardParams& p, SharedStorage& s, bool with_o, int hk,
                                                 int h) {
    const WorkItem item = work_item(p, blockIdx.x, blockIdx.y, blockIdx.z);  // pure: recomputed per role
    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    const int64_t b = item.batch;
    const int warp = threadIdx.x / 32;
    ChunkGates gates;  // warp 0
#pragma unroll 1
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int buf = static_cast<int>(c & 1);
      Slot& slot = s.slot[buf];
      const int64_t t0 = item.bos + c * kChunk;
      const int rows = chunk_rows(item, c);
      timeline_mark(p, 0, c, 0);
      if (c >= 2) tma::wait(&s.free[buf], static_cast<uint32_t>(((c - 2) >> 1) & 1));  // chunk c-2 is done
      timeline_mark(p, 0, c, 1);
      load_tiles(p, slot, b, t0, rows, hk, h, item.zero_v, with_o);
      if (warp == 0) gates = fetch_chunk_gates(p, b, t0, rows, h);
      InversePair a_r[4][4];
      load_inverse_fragment(p, a_r, b, t0, rows, h);
      cp_async_wait<0>();
      timeline_mark(p, 0, c, 2);
      if (warp == 0) store_chunk_gates(s.gcum[buf], s.beta[buf], gates);
      wg::fence_shared_to_async();  // the landed tiles, for the wgmmas below
      group_sync(kAuxBarrier);      // ... and every thread's tiles and the gates, for the whole group
      timeline_mark(p, 0, c, 3);
      chunk_products(p, slot, s.gcum[buf], s.beta[buf], a_r, rows, with_o, c);
      wg::fence_shared_to_async();  // P, Ag, -W~ for the state groups' wgmmas
      tma::arrive(&s.ready[buf]);
      timeline_mark(p, 0, c, 7);
    }
  }

  // ---- state groups ---------------------------------------------------------------------------

  // Rows 0..127 of this group's 64 columns of S -> its bf16 panel.
  static __device__ __forceinline__ void store_state_panel(unsigned char* panel, const Acc (&state)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      Tiles::store_fragments(panel, 64 * i, [&](int j, int e) { return state[i][4 * j + e]; });
  }

  static __device__ __forceinline__ void run_state(const ForwardParams& p, SharedStorage& s, bool with_o, int h,
                                                   int group) {
    const WorkItem item = work_item(p, blockIdx.x, blockIdx.y, blockIdx.z);  // pure: recomputed per role
    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    const int64_t b = item.batch;
    const int col0 = 64 * group, barrier = 2 + group;
    unsigned char* state_panel = s.state + group * kStatePanelBytes;
    unsigned char* vd_panel = s.vd + group * kPanelBytes;
    unsigned char* vd_decayed_panel = s.vd_decayed + group * kPanelBytes;

    Acc state[2];
    Tiles::load_initial_state(item, col0, state);
    store_state_panel(state_panel, state);
    wg::fence_shared_to_async();
    group_sync(barrier);

#pragma unroll 1
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int buf = static_cast<int>(c & 1);
      const Slot& slot = s.slot[buf];
      const int64_t t0 = item.bos + c * kChunk;
      const int rows = chunk_rows(item, c);
      timeline_mark(p, 1, c, 0);
      tma::wait(&s.ready[buf], static_cast<uint32_t>((c >> 1) & 1));
      timeline_mark(p, 1, c, 1);
      const float* gcum = s.gcum[buf];

      // Vd = Ag V + (-W~) S and QS, this group's columns.
      Acc vd, qs;
      wg::fence();
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(vd, wg::descriptor<Major::kK>(slot.ag, k0, kChunk),
                                                    wg::descriptor<Major::kMN>(slot.v + group * kPanelBytes, k0, kChunk),
                                                    k0 > 0);
#pragma unroll
      for (int k0 = 0; k0 < kHeadDim; k0 += 16)
        wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(vd, wg::descriptor<Major::kK>(slot.w_neg, k0, kChunk),
                                                    wg::descriptor<Major::kMN>(state_panel, k0, kHeadDim), true);
      if (with_o) {
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16)
          wg::mma_ss<Elem, 64, Major::kK, Major::kMN>(qs, wg::descriptor<Major::kK>(slot.q, k0, kChunk),
                                                      wg::descriptor<Major::kMN>(state_panel, k0, kHeadDim), k0 > 0);
      }
      wg::commit();
      if (with_o && c > 0) Tiles::copy_out(p, vd_panel, b, t0 - kChunk, kChunk, h, col0);  // chunk c-1 was full
      wg::wait<0>();
      wg::fence_operand(vd);
      wg::fence_operand(qs);
      timeline_mark(p, 1, c, 2);
      group_sync(barrier);  // the copy's reads of the Vd panel, before Vd overwrites it

      const float gamma = gcum[kChunk - 1];
      {
        const float g_rows[2] = {gcum[Tiles::acc_row(0)], gcum[Tiles::acc_row(2)]};
        const float rho[2] = {exp2_approx(gamma - g_rows[0]), exp2_approx(gamma - g_rows[1])};
        if (with_o) Tiles::store_fragments(vd_panel, 0, [&](int j, int e) { return vd[4 * j + e]; });
        Tiles::store_fragments(vd_decayed_panel, 0, [&](int j, int e) { return rho[e / 2] * vd[4 * j + e]; });
        if (with_o) {
          const float decay[2] = {exp2_approx(g_rows[0]), exp2_approx(g_rows[1])};
#pragma unroll
          for (int x = 0; x < 32; ++x) qs[x] *= decay[(x % 4) / 2];
        }
      }
      wg::fence_shared_to_async();  // Vd, rho Vd
      group_sync(barrier);

      // O = Gamma QS + P Vd; S = e^gamma S + K^T (rho Vd).
      Tiles::issue_output_and_update(state, qs, gamma, with_o, slot.p, slot.k, vd_panel, vd_decayed_panel);
      timeline_mark(p, 1, c, 3);
      wg::wait<0>();
      wg::fence_operand(state[0]);
      wg::fence_operand(state[1]);
      wg::fence_operand(qs);
      timeline_mark(p, 1, c, 4);
      tma::arrive(&s.free[buf]);  // every read of the slot (wgmma operands, gates) is done

      if (with_o)  // o into the Vd panel (P Vd has read it); copied out under the next chunk's wgmmas
        Tiles::store_fragments(vd_panel, 0, [&](int j, int e) { return p.scale * qs[4 * j + e]; });
      store_state_panel(state_panel, state);
      Tiles::store_checkpoint(p, item, c, rows, h, col0, state);
      wg::fence_shared_to_async();  // S for the next chunk's wgmmas
      group_sync(barrier);          // ... and o, for the copy
      timeline_mark(p, 1, c, 5);
    }
    if (with_o && num_chunks > 0) {  // the last chunk's o
      const int64_t last = num_chunks - 1;
      Tiles::copy_out(p, vd_panel, b, item.bos + last * kChunk, chunk_rows(item, last), h, col0);
    }
    // The work item again (pure): not kept in registers across the loop.
    if (const StateBlock final = work_item(p, blockIdx.x, blockIdx.y, blockIdx.z).final; final.base != nullptr)
      Tiles::store_state(final, col0, state);
  }

  static __device__ void run(const ForwardParams& p) {
    extern __shared__ __align__(1024) unsigned char smem_ws[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_ws);
    run_roles<kAuxRegisters, kStateRegisters>(
        p, s, [&](bool with_o, int hk, int h) { run_aux(p, s, with_o, hk, h); },
        [&](bool with_o, int h, int group) { run_state(p, s, with_o, h, group); });
  }
};

template <typename Elem, typename InverseT>
__global__ void __launch_bounds__(384, 1) fused_forward_ws_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  FusedForwardWs<Elem, InverseT>::run(p);
}

}  // namespace flashgdn::kern
