// Fused chunked forward with the chunk inverse inside (v5, sm_90a; FusedKernel::kInverseInside):
// v4's work items, state groups (S^T in registers as the RS wgmma A operand) and TMA ring, with the
// aux group forming A_r itself (warpgroup_inverse.cuh), so that no chunk-inverse kernel runs and no
// A_r round trip goes through HBM; only the chunk's gate record comes from a pre-pass
// (chunk_gates_kernel, forward_aux.cu).
//
// Math (transposed, rows of S^T are value columns; Gamma = diag(2^gcum), gcum in log2 units):
//   U^T  [64v, 64t] = S^T K^T                        the state's product with this chunk's keys
//   W^T  [64v, 64t] = V^T - U^T Gamma                 W = V - Gamma K S
//   Vd^T [64v, 64t] = W^T Ag^T                        Ag = G (.) A_r (.) 1 beta^T  (from the aux)
//   O^T  [64v, 64t] = scale ((S^T Q^T) Gamma + Vd^T P^T),   S^T' = e^gamma S^T + (Vd^T diag(rho)) K
// So the state groups' chain has one product more than v4's (U^T, then Vd^T: v4 got -W~ = -B~ K from
// its aux), and the aux has no -B~ and -W~ but K K^T and the inverse; P and Ag, which v4's aux made,
// are formed by the state groups (half each), where they overlap the groups' own wgmmas.
//
// Grid (N sequences or segments, Hv[, 2 for the CP state pass]), or (1, Hv, N) with the sequence order
// (varlen without CP: the sequences longest first, sequence.cuh heads_fastest); block 384 threads = 3
// warpgroups.
//   aux   (warpgroup 0; setmaxnreg kAuxRegisters): thread 0 issues chunk c's K boxes (two 64-column
//         panels) and gate record (gcum | beta) into key stage c % 3 on keys_loaded[c % 3], and its Q
//         (with o) and V (unless zero_v) boxes into slot c % 2 on loaded[c % 2]: once the state
//         groups have finished chunk c-1 (free), chunk c+1's slot and chunk c+2's keys (run_aux).
//         Per chunk:
//           wait keys_loaded; a partial chunk's rows past its end zeroed (Q, V after loaded); group barrier
//           the gate tables 2^gcum, 2^(gamma - gcum) (one ex2 a thread)            -> decay, rho
//           (a folded chunk: beta 2^-gcum too, threads 0-63, and a group barrier  -> x_scale)
//           KK   [64,64] = K[64,128] @ K^T                 SS wgmma, 8 x m64n64k16
//           X    = (I + diag(beta) StrictLower(KK))^{-1}    WarpgroupInverse         -> x[c % 2]
//             (a folded chunk, folds_gates: -gamma <= 64 in log2 units, bf16: X' = X diag(beta 2^-gcum)
//             in bf16 -> slot.ag too, written by the inverse's stages; the tiles' blocks above the
//             diagonal zeroed at the start)
//           ready[c % 2]
//   state (warpgroups 1, 2 = groups g 0, 1; setmaxnreg kStateRegisters): value rows 64 g .. 64 g + 63
//         of S^T as one m64n128 fp32 accumulator, and its A fragments. Per chunk c, after ready and
//         loaded (K from key stage c % 3, Q, V from slot c % 2):
//           U^T  = S^T @ K^T (RS, 8; K as K-major B);  QS^T = S^T @ Q^T (RS, 8; o only)
//           W^T  = V^T - U^T Gamma (V^T by ldmatrix.trans from V's panel g) -> A fragments
//           folded chunk (Ag = diag(2^gcum) X' with X' = X diag(beta 2^-gcum), so Vd^T = W^T Ag^T below):
//             Vd'^T = W^T @ X'^T (RS, 4; X' from slot.ag, the aux group's) = Vd^T diag(2^-gcum)
//             P's half = QK^T (lower triangle, no G) -> slot.p (stmatrix)
//             chunk end (Rs::finish_chunk, folded): (rho Vd)^T = 2^gamma Vd'^T; S^T *= e^gamma;
//             both state groups' barrier (P whole); S^T += (rho Vd)^T @ K, O^T += Vd'^T @ P^T (RS, 4 +
//             4); o staged as O^T diag(2^gcum) (QS^T's columns untouched before it)
//           else (stronger decay):
//             Ag's columns 32 g .. 32 g + 31 = G (.) X (.) 1 beta^T (X by ldmatrix) -> slot.ag, and
//                    both state groups' barrier (Ag whole)
//             Vd^T = W^T @ Ag^T (RS, 4)
//             P's half = G (.) QK^T (lower triangle) -> slot.p (stmatrix)
//             then v4's epilogue: rho Vd and Vd fragments, QS^T *= Gamma, S^T *= e^gamma; both state
//             groups' barrier (P whole); S^T += (rho Vd)^T @ K (RS, 4 x m64n128k16), O^T += Vd^T @ P^T
//             (RS, 4)
//           QK^T columns 32 g .. 32 g + 31 (SS, 8 x m64n32k16; o only) issued with Vd^T; then free[c % 2],
//           o -> o[c % 2] (stmatrix.trans), copied out under chunk c+1's update
// kKeepsInverse (the forward keeping the inverse cache, ForwardProblem::inverse_cache; a kernel of its
// own, so that the default forward's code is unchanged): the aux group writes chunk c in the
// backward's format (store_inverse_cache) after chunk c's ready, before its wait for the state groups'
// free of chunk c-1, where the aux, ahead, otherwise idles (~0.9-1.5k cycles a chunk, bench/notes.md;
// behind, the stores delay chunk c+1's slot issue, whose tiles still land long before chunk c+1's
// ready): X's valid rows in fp16 as they are (p.inverse: the backward's A_r rows, zeros above the
// diagonal), Ag = G (.) X (.) 1 beta^T in Elem from the same vectors (p.gated_inverse_out; every chunk,
// the folded ones too, whose state groups form no Ag), and the chunk's window term
// (p.chunk_window_terms) from L's diagonal beta_t |k_t|^2; the gate records come from
// chunk_gates_kernel, pointed into the cache. 16 KiB a chunk by 16-byte stores, 8 a thread.
// Shared memory (~210 KiB): slots [2] of {q, v [64][128]; p, ag [64][64]} (48 KiB each); k [3][64][128];
// o [2][64][128]; the inverse's workspace (13 KiB) and x [2] (X in fp16, 9 KiB each); gcum, beta, decay,
// rho [3][64] fp32, x_scale [64] fp32 (the aux's chunk); mbarriers ready[2] (128 arrivals), free[2]
// (256), loaded[2] and keys_loaded[3] (1 + TMA bytes); window_parts [4] fp32 (kKeepsInverse). Named
// barriers: 1 the aux group, 2 + g state group g, 4 both state groups.
#pragma once

#include "kernels/sm90/fused_forward_rs.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/warpgroup_inverse.cuh"

namespace flashgdn::kern {

template <typename Elem, bool kKeepsInverse = false>
struct FusedForwardInv {
  using Rs = FusedForwardRs<Elem, __nv_bfloat16>;  // state-group helpers (fragments, o, checkpoints)
  using Aux = typename Rs::Aux;                     // product_p, column_values, chunk_rows, group_sync
  using Tiles = typename Rs::Tiles;                 // accumulator coordinates, stmatrix epilogues, o copy
  using Inverse = WarpgroupInverse;
  static constexpr int kThreads = 384;
  static constexpr int kAuxRegisters = 120, kStateRegisters = 192;
  static_assert(kAuxRegisters + 2 * kStateRegisters <= 3 * 168, "more than the CTA's registers");
  static constexpr int kTokenTileBytes = Tiles::kTokenTileBytes;
  static constexpr int kPanelBytes = Tiles::kPanelBytes;
  using Major = wg::Major;
  using Acc = float[32];
  using PartAcc = float[16];  // m64n32 accumulator
  using StateAcc = float[64];
  static constexpr int kStateBarrier = 4;  // named barrier of both state groups (256 threads)
  using Fragments = uint32_t[4];

  // Chunk c's tiles: the keys (and the gate record) in key stage c % kKeyStages, which the aux group
  // needs first, one chunk earlier than the rest (Q, V, and the state groups' P, Ag) in slot c % 2.
  static constexpr int kKeyStages = 3;
  struct Slot {
    alignas(1024) unsigned char q[kTokenTileBytes];
    alignas(1024) unsigned char v[kTokenTileBytes];
    alignas(1024) unsigned char p[Tiles::kSquareTileBytes];
    alignas(1024) unsigned char ag[Tiles::kSquareTileBytes];
  };
  struct SharedStorage {
    Slot slot[2];
    alignas(1024) unsigned char k[kKeyStages][kTokenTileBytes];
    alignas(1024) unsigned char o[2][kTokenTileBytes];
    Inverse::Workspace inverse;
    Inverse::Tile x[2];  // X of chunk c (fp16) in x[c % 2] until the state groups have formed Ag from it
    alignas(16) float gcum[kKeyStages][kChunk];
    alignas(16) float beta[kKeyStages][kChunk];
    alignas(16) float decay[kKeyStages][kChunk];  // 2^gcum[t]             (the aux group, from gcum)
    alignas(16) float rho[kKeyStages][kChunk];    // 2^(gcum[63] - gcum[t])
    alignas(16) float o_scale[kKeyStages][kChunk];  // p.scale 2^gcum[t] (a folded chunk's o columns)
    alignas(16) float x_scale[kChunk];              // beta_t 2^(-gcum[t]) of the aux's chunk (folded chunks)
    alignas(8) uint64_t ready[2];
    alignas(8) uint64_t free[2];
    alignas(8) uint64_t loaded[2];                  // slot c % 2: Q, V
    alignas(8) uint64_t keys_loaded[kKeyStages];    // key stage c % 3: K, gate record
    // kKeepsInverse: aux warp w's window terms of its 16 tokens (last: the other members' offsets, and so
    // the default kernel's code, are those of the kernel without it)
    alignas(16) float window_parts[4];
  };
  static_assert(sizeof(SharedStorage) <= 232448, "above the 227 KiB of shared memory a block may opt in to");

  // A chunk's per-token gate scales as tables (Rs::finish_chunk's Gates): the aux group writes them
  // once a chunk (write_gate_tables), so that the state groups' W and chunk end need no ex2 of their
  // own (48 a thread a chunk, on the SFU's 16 lanes a SM, in both groups at once).
  struct GateTables {
    static constexpr bool kScaledDecay = false;  // decay_t: 2^gcum[t] (o scaled as staged)
    const float* gcum;
    const float* decay_t;
    const float* rho_t;
    __device__ __forceinline__ float gamma() const { return gcum[kChunk - 1]; }
    __device__ __forceinline__ float2 decay_pair(int t) const { return *reinterpret_cast<const float2*>(decay_t + t); }
    __device__ __forceinline__ float2 rho_pair(int t) const { return *reinterpret_cast<const float2*>(rho_t + t); }
    const float* o_scale_t;
    __device__ __forceinline__ float decay(int t) const { return decay_t[t]; }
    __device__ __forceinline__ float scaled_decay(int t, float) const { return o_scale_t[t]; }
  };
  static __device__ __forceinline__ GateTables gate_tables(const SharedStorage& s, int stage) {
    return {s.gcum[stage], s.decay[stage], s.rho[stage], s.o_scale[stage]};
  }
  // Aux thread i: 2^gcum[i] (i < 64) or 2^(gamma - gcum[i - 64]), into key stage `stage`'s tables,
  // and in a folded chunk beta_i 2^-gcum[i] (i < 64: the columns of X' = X diag(beta 2^-gcum), which
  // the inverse's stages read after the group's barrier that `folded` adds).
  static __device__ __forceinline__ void write_gate_tables(SharedStorage& s, int stage, bool folded, float scale) {
    const int i = threadIdx.x % 128, t = i % kChunk;
    const float g = s.gcum[stage][t];
    if (i < kChunk) {
      const float d = exp2_approx(g);
      s.decay[stage][t] = d;
      s.o_scale[stage][t] = scale * d;
    } else {
      const float rho = exp2_approx(s.gcum[stage][kChunk - 1] - g);
      s.rho[stage][t] = rho;
      // X'' = X diag(beta rho), so that W^T X''^T = (rho Vd)^T (the update's operand as it is)
      if (folded) s.x_scale[t] = s.beta[stage][t] * rho;
    }
    if (folded) Aux::group_sync(Aux::kAuxBarrier);
  }

  // Folded gates (bf16 operands only): Ag = diag(2^gcum) X' on and below the diagonal, with
  // X' = X diag(beta 2^-gcum) (the bf16 copy the aux group's inverse writes into slot.ag, its columns
  // scaled as they are stored), so  Vd^T = W^T Ag^T = (W^T X'^T) diag(2^gcum); diag(2^gcum) is carried
  // to the chunk end: P = G (.) QK^T = diag(2^gcum) QK^T diag(2^-gcum) on the lower triangle, so
  // O^T = (QS^T + Vd'^T QK^T) diag(2^gcum) with Vd'^T = W^T X'^T = Vd^T diag(2^-gcum) (Rs::finish_chunk,
  // folded). The state groups then form no Ag and no G, and pass no barrier before Vd. Which chunks
  // fold: Rs::folds_gates (-gamma <= 64 in log2 units).
  static __device__ __forceinline__ bool folds_gates(const float* gcum) { return Rs::folds_gates(gcum); }

  // ---- aux group ------------------------------------------------------------------------------

  // K K^T of a chunk's keys (m64n64 accumulator, wgmma.cuh layout).
  static __device__ __forceinline__ void product_kk(const unsigned char* k, Acc& kk) {
    wg::fence();
    wg::mma_ss_k<Elem, 64, Major::kK, Major::kK, kHeadDim, true>(kk, k, kChunk, k, kChunk, false);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(kk);
  }

  // Thread 0 issues chunk c's keys and gate record into key stage c % 3 on keys_loaded and its Q
  // (with o) and V (unless zero_v) into slot c % 2 on loaded: chunks 0 and 1's keys and chunk 0's
  // slot up front; after chunk c's ready, once the state groups have finished chunk c-1 (free), chunk
  // c+1's slot and chunk c+2's keys (stage (c+2) % 3 held chunk c-1's). So the aux group, which needs
  // only the keys, finds chunk c+1's landed when it gets there, where with one ring it waited for
  // them (~1.4k cycles a chunk at d96055b) while the state groups waited for it. Per chunk:
  //   wait keys_loaded; a partial chunk's rows past its end zeroed (Q and V's after loaded); group
  //   barrier; the gate tables; K K^T, L, X into x[c % 2] (chunk c-2's Ag was formed from it: the
  //   whole group waited for free of chunk c-2 at the end of chunk c-1); ready; kKeepsInverse: chunk
  //   c's entries of the inverse cache (store_inverse_cache), before the wait for free.
  static __device__ __forceinline__ void run_aux(const ForwardParams& p, const ForwardTileMaps& maps,
                                                 SharedStorage& s, bool with_o, int hk, int h) {
    timeline_mark(p, 0, 0, 10);
    if (threadIdx.x == 0) {  // the descriptors' fetch under the work item's lookups
      tma::prefetch_map(&maps.k);
      if (with_o) tma::prefetch_map(&maps.q);
      tma::prefetch_map(&maps.v);
    }
    const WorkItem item = block_work_item(p);
    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    const int b = static_cast<int>(item.batch);
    const bool load_v = !item.zero_v;
    if (threadIdx.x == 0) {
      for (int i = 0; i < 2; ++i) tma::barrier_init(&s.loaded[i], 1);
      for (int i = 0; i < kKeyStages; ++i) tma::barrier_init(&s.keys_loaded[i], 1);
      tma::fence_barrier_init();
    }
    if (!load_v)  // V = 0 (the CP state pass's transition items): never loaded
      for (int i = 0; i < 2; ++i) Rs::zero_rows(s.slot[i].v, 2, 0);
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {  // the folded chunks' X' tiles: zero above the diagonal
      static_assert(Tiles::kSquareTileBytes == kPanelBytes, "an Ag tile is one 64-row panel");
      for (int i = 0; i < 2; ++i) Rs::zero_rows(s.slot[i].ag, 1, 0);
      wg::fence_shared_to_async();
    }
    Aux::group_sync(Aux::kAuxBarrier);

    constexpr uint32_t kGateBytes = kChunk * sizeof(float);
    const uint32_t slot_bytes = kPanelBytes * ((with_o ? 2 : 0) + (load_v ? 2 : 0));
    auto issue_keys = [&](int64_t c, int stage) {  // thread 0; stage = c % kKeyStages
      const int t0 = static_cast<int>(item.bos + c * kChunk);
      uint64_t* landed = &s.keys_loaded[stage];
      const float* record = p.chunk_gates + ((item.first_chunk_id + c) * p.num_v_heads + h) * 2 * kChunk;
      tma::arrive_expect_bytes(landed, 2 * kPanelBytes + 2 * kGateBytes);
      tma::load_bulk(s.gcum[stage], record, kGateBytes, landed);
      tma::load_bulk(s.beta[stage], record + kChunk, kGateBytes, landed);
      for (int panel = 0; panel < 2; ++panel)
        tma::load_4d(s.k[stage] + panel * kPanelBytes, &maps.k, landed, 64 * panel, hk, t0, b);
    };
    auto issue_slot = [&](int64_t c) {  // thread 0
      const int buf = static_cast<int>(c & 1), t0 = static_cast<int>(item.bos + c * kChunk);
      uint64_t* landed = &s.loaded[buf];
      tma::arrive_expect_bytes(landed, slot_bytes);
      for (int panel = 0; panel < 2; ++panel) {
        if (with_o) tma::load_4d(s.slot[buf].q + panel * kPanelBytes, &maps.q, landed, 64 * panel, hk, t0, b);
        if (load_v) tma::load_4d(s.slot[buf].v + panel * kPanelBytes, &maps.v, landed, 64 * panel, h, t0, b);
      }
    };
    timeline_mark(p, 0, 1, 10);
    if (fused_forward_starts_early(p)) wait_for_previous_grid();  // the gate records
    if (threadIdx.x == 0 && num_chunks > 0) {  // chunk 0's keys and slot, chunk 1's keys
      issue_keys(0, 0);
      issue_slot(0);
      if (num_chunks > 1) issue_keys(1, 1);
    }
    timeline_mark(p, 0, 1, 11);
    int stage = 0;               // c % kKeyStages
    uint32_t key_phase = 0;      // (c / kKeyStages) & 1
#pragma unroll 1
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int buf = static_cast<int>(c & 1);
      const int rows = Aux::chunk_rows(item, c);
      timeline_mark(p, 0, c, 0);
      timeline_mark(p, 0, c, 1);
      tma::wait(&s.keys_loaded[stage], key_phase);
      if (rows < kChunk) {  // the last chunk of a sequence: its rows past the end, zero
        Rs::zero_rows(s.k[stage], 2, rows);
        tma::wait(&s.loaded[buf], static_cast<uint32_t>((c >> 1) & 1));
        if (with_o) Rs::zero_rows(s.slot[buf].q, 2, rows);
        if (load_v) Rs::zero_rows(s.slot[buf].v, 2, rows);
        wg::fence_shared_to_async();  // the zeroed rows, for the wgmmas
        Aux::group_sync(Aux::kAuxBarrier);
      }
      // a folded chunk's X' = X diag(beta 2^-gcum) also in bf16 into slot.ag, for the state groups' Vd wgmma
      const bool folds = folds_gates(s.gcum[stage]);
      write_gate_tables(s, stage, folds, p.scale);  // decay, rho read after ready
      timeline_mark(p, 0, c, 2);
      {
        Acc kk;
        product_kk(s.k[stage], kk);
        timeline_mark(p, 0, c, 3);
        Inverse::store_l(s.inverse, kk, s.beta[stage]);
      }
      timeline_mark(p, 0, c, 4);
      const typename Inverse::ScaledCopy copy{s.slot[buf].ag, s.x_scale, folds};
      Inverse::invert(s.inverse, s.x[buf], copy, Aux::kAuxBarrier, [&](int step) { timeline_mark(p, 0, c, 8 + step); });
      timeline_mark(p, 0, c, 5);
      if (folds) wg::fence_shared_to_async();  // else X is read by ldmatrix (no proxy fence)
      tma::arrive(&s.ready[buf]);
      timeline_mark(p, 0, c, 7);
      if constexpr (kKeepsInverse) store_inverse_cache(p, s, item, c, stage, buf, h);
      if (c + 1 < num_chunks) {
        // The whole group waits: chunk c+1's X goes into x[(c-1) % 2], which chunk c-1's Ag was formed from.
        if (c >= 1) tma::wait(&s.free[buf ^ 1], static_cast<uint32_t>(((c - 1) >> 1) & 1));
        // the two issues on two warps (each warp's lag behind the group halves)
        if (threadIdx.x == 0) issue_slot(c + 1);
        if (threadIdx.x == 32 && c + 2 < num_chunks) issue_keys(c + 2, stage == 0 ? kKeyStages - 1 : stage - 1);
      }
      __syncwarp();
      if (++stage == kKeyStages) stage = 0, key_phase ^= 1;
    }
    timeline_mark(p, 0, 0, 11);
  }

  // kKeepsInverse: chunk c's entries of the inverse cache (inverse_cache_layout, runtime/common.h), as
  // chunk_inverse's fp16 rows beside Ag lay them out: rows b T + t of the chunk's valid tokens, 64
  // values each, at [(b T + t) Hv + h]. Thread (warp w, lane): the 16-byte vectors of block column w,
  // columns t = col0 .. col0 + 7 (col0 = 16 w + 8 (lane % 2); their gcum and beta read once, into
  // registers), row lane / 2 of each block row R (X's vector by one shared load, stored raw, then gated):
  //   R < w  (above the diagonal, never formed): zeros, both outputs
  //   R == w Ag[s, t] = 2^(gcum_s - gcum_t) X[s, t] beta_t for t <= s, else 0 (one ex2 an element)
  //   R > w  2^(gcum_s - gcum_e) col[t] X[s, t], col[t] = 2^(gcum_e - gcum_t) beta_t, e = 16 w + 15 (the
  //          lane's 8 column factors once, one ex2 a vector; both exponents <= 0, so no overflow)
  // What it reads stays put meanwhile: x[c % 2] until chunk c+2's inverse, the key stage's gcum and
  // beta until chunk c+3's keys (issued after chunk c+1's inverse, whose barriers follow these reads;
  // this chunk's issue writes key stage (c+2) % 3 and slot (c+1) % 2 only).
  // The window term sum_t g_t + log max(1, |1 - beta_t |k_t|^2|) (chunk_inverse's) takes beta_t
  // |k_t|^2 from L_ww's diagonal (ws.l_diag_t, beta applied to K K^T in fp32: the same product), each
  // warp its own block's 16 tokens (it alone rewrites them, in chunk c+1's store_l), summed by thread
  // 0 after a group barrier (window_parts is rewritten only after chunk c+1's inverse).
  static __device__ __forceinline__ void store_inverse_cache(const ForwardParams& p, SharedStorage& s,
                                                             const WorkItem& item, int64_t c, int stage, int buf,
                                                             int h) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    {
      const float d = s.inverse.l_diag_t[warp][lane % 16][lane % 16];
      const float term = warp_sum(lane < 16 ? window_growth(d) : 0.f);
      if (lane == 0) s.window_parts[warp] = term;
    }
    const float* gcum = s.gcum[stage];
    const typename Inverse::Tile& x = s.x[buf];
    const int rows = Aux::chunk_rows(item, c), col0 = 16 * warp + 8 * (lane % 2);
    float g_col[8], beta_col[8], col[8];
#pragma unroll
    for (int j = 0; j < 8; j += 4) {
      const float4 g4 = *reinterpret_cast<const float4*>(gcum + col0 + j);
      const float4 b4 = *reinterpret_cast<const float4*>(s.beta[stage] + col0 + j);
      g_col[j] = g4.x, g_col[j + 1] = g4.y, g_col[j + 2] = g4.z, g_col[j + 3] = g4.w;
      beta_col[j] = b4.x, beta_col[j + 1] = b4.y, beta_col[j + 2] = b4.z, beta_col[j + 3] = b4.w;
    }
    const float g_end = gcum[16 * warp + 15];
    if (warp < 3) {  // block rows below the diagonal block
#pragma unroll
      for (int j = 0; j < 8; ++j) col[j] = exp2_approx(g_end - g_col[j]) * beta_col[j];
    }
    // row lane / 2 of block row 0, then 16 rows on a block row (64-bit pointer steps, not products)
    const int64_t block_stride = 16 * static_cast<int64_t>(p.num_v_heads) * kChunk;
    const int64_t first =
        ((item.batch * p.seqlen + item.bos + c * kChunk + lane / 2) * p.num_v_heads + h) * kChunk + col0;
    __half* out = static_cast<__half*>(p.inverse) + first;
    Elem* gated = static_cast<Elem*>(p.gated_inverse_out) + first;
#pragma unroll 1  // one vector's temporaries at a time (unrolled, the aux's 120 registers spill)
    for (int block_row = 0; block_row < 4; ++block_row, out += block_stride, gated += block_stride) {
      const int row = 16 * block_row + lane / 2;
      if (row >= rows) break;  // and every later block row's
      if (block_row < warp) {
        store_global_16(out, 0u, 0u, 0u, 0u);
        store_global_16(gated, 0u, 0u, 0u, 0u);
        continue;
      }
      const uint4 raw = x.raw16(row, col0);
      store_global_16(out, raw.x, raw.y, raw.z, raw.w);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      float a[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[j]));
        a[2 * j] = pair.x, a[2 * j + 1] = pair.y;
      }
      const float g_row = gcum[row];
      if (block_row == warp) {
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = col0 + j <= row ? exp2_approx(g_row - g_col[j]) * a[j] * beta_col[j] : 0.f;
      } else {
        const float row_factor = exp2_approx(g_row - g_end);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] *= row_factor * col[j];
      }
      store_global_16(gated, pack_pair<Elem>(a[0], a[1]), pack_pair<Elem>(a[2], a[3]), pack_pair<Elem>(a[4], a[5]),
                      pack_pair<Elem>(a[6], a[7]));
    }
    Aux::group_sync(Aux::kAuxBarrier);  // the four warps' window parts
    if (threadIdx.x == 0) {
      const float sum = (s.window_parts[0] + s.window_parts[1]) + (s.window_parts[2] + s.window_parts[3]);
      p.chunk_window_terms[(item.first_chunk_id + c) * p.num_v_heads + h] = chunk_window_term(gcum[kChunk - 1], sum);
    }
  }

  // ---- state groups ---------------------------------------------------------------------------

  // W^T = V^T - U^T Gamma as the A fragments of Vd^T = W^T Ag^T (k over the chunk's tokens; Gamma's
  // diagonal from the decay table): V^T's 8 x 8 blocks come transposed by ldmatrix.trans from V's
  // panel g (rows = tokens), block (column block j, row half hf) landing as this thread's accumulator
  // pair (j, e = 2 hf): one x4 per k-step holds registers q = 0..3 of it (j = 2 ks + q / 2, hf = q % 2).
  static __device__ __forceinline__ void w_fragments(const unsigned char* v_panel, const float* decay, const Acc& u,
                                                     Fragments (&w)[4]) {
    const int lane = threadIdx.x % 32, band = 16 * ((threadIdx.x / 32) % 4), c_lane = 2 * (lane % 4);
    const int m = lane / 8;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t vt[4];
      ldmatrix_x4_trans(vt, v_panel + wg::swizzled_offset(8 * (2 * ks + m / 2) + lane % 8, band + 8 * (m % 2)));
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = 2 * ks + q / 2, x = 4 * j + 2 * (q % 2);
        const float2 d = *reinterpret_cast<const float2*>(decay + 8 * j + c_lane);
        const float2 v = Rs::unpack(vt[q]);
        w[ks][q] = pack_pair<Elem>(v.x - d.x * u[x], v.y - d.y * u[x + 1]);
      }
    }
  }

  // Ag = G (.) X (.) 1 beta^T on and below the diagonal: state group g's columns 32 g .. 32 g + 31
  // (k-steps ks = 2 g, 2 g + 1) into slot.ag. X's fp16 tile comes by ldmatrix in the A-fragment
  // layout of the warp's band (register q: rows + 8 (q % 2), columns 16 ks + 8 (q / 2) + c_lane),
  // which is stmatrix_x4's order for column blocks 2 ks, 2 ks + 1; X's blocks above the block
  // diagonal are never formed (selected away with the rest of the upper triangle).
  static __device__ __forceinline__ void store_ag_half(unsigned char* ag_tile, const typename Inverse::Tile& x,
                                                       const float* gcum, const float* beta, int group) {
    const int lane = threadIdx.x % 32, band = 16 * ((threadIdx.x / 32) % 4), c_lane = 2 * (lane % 4);
    const int r = band + lane / 4;
    const float g_rows[2] = {gcum[r], gcum[r + 8]};
#pragma unroll 1  // one k-step's temporaries at a time: the state groups have few registers to spare
    for (int half = 0; half < 2; ++half) {
      const int ks = 2 * group + half;
      uint32_t regs[4];
      ldmatrix_x4(regs, x.v + (band + lane % 16) * Inverse::kPitch + 16 * ks + 8 * (lane / 16));
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 xv = __half22float2(*reinterpret_cast<const __half2*>(&regs[q]));
        const int row = r + 8 * (q % 2), col = 16 * ks + 8 * (q / 2) + c_lane;
        const float a0 = row >= col ? exp2_approx(g_rows[q % 2] - gcum[col]) * xv.x * beta[col] : 0.f;
        const float a1 = row >= col + 1 ? exp2_approx(g_rows[q % 2] - gcum[col + 1]) * xv.y * beta[col + 1] : 0.f;
        regs[q] = pack_pair<Elem>(a0, a1);
      }
      stmatrix_x4(Tiles::fragment_rows(ag_tile, 0, 2 * ks), regs);
    }
  }

  // P [64,64] = G (.) (Q K^T), lower triangle with diagonal: state group g's 32 key columns
  // 32 g .. 32 g + 31 (its m64n32 accumulator qk) into the P tile, by two stmatrix_x4. kFolded: Q K^T
  // masked, without G (Rs::finish_chunk's folded chunk end puts the gates on o's columns).
  template <bool kFolded>
  static __device__ __forceinline__ void store_p_half(unsigned char* p_tile, const float* gcum, const PartAcc& qk,
                                                      int group) {
    const int r = Tiles::acc_row(0);
    const float g_rows[2] = {gcum[r], gcum[r + 8]};
    // P' = 2^-gamma mask(Q K^T), since O's operand is (rho Vd)^T = 2^gamma Vd'^T
    [[maybe_unused]] const float inv_gamma = kFolded ? exp2_approx(-gcum[kChunk - 1]) : 1.f;
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      uint32_t regs[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int jj = j + m / 2, e = 2 * (m % 2), row = Tiles::acc_row(e), col = 32 * group + Tiles::acc_col(jj, e);
        const float g0 = kFolded ? inv_gamma : exp2_approx(g_rows[e / 2] - gcum[col]);
        const float g1 = kFolded ? inv_gamma : exp2_approx(g_rows[e / 2] - gcum[col + 1]);
        const float p0 = row >= col ? g0 * qk[4 * jj + e] : 0.f;
        const float p1 = row >= col + 1 ? g1 * qk[4 * jj + e + 1] : 0.f;
        regs[m] = pack_pair<Elem>(p0, p1);
      }
      stmatrix_x4(Tiles::fragment_rows(p_tile, 0, 4 * group + j), regs);
    }
  }

  // kWithO: the main pass (o written); without, the CP state pass (no Q: no QS, P Vd, o). The kernel's
  // maps: the roles' common entry (Rs::run_kernel); v5's state groups use none.
  template <bool kWithO>
  static __device__ __forceinline__ void run_state(const ForwardParams& p, const ForwardTileMaps&, SharedStorage& s,
                                                   int h, int group) {
    const WorkItem item = block_work_item(p);  // pure: recomputed per role
    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;

    StateAcc st;
    Fragments st_frag[8];
    Rs::start_item(p, item, group, st, st_frag);
    const uint32_t out_lanes = kWithO ? Rs::o_lanes() : 0u;

#pragma unroll 1
    for (int64_t c = 0; c < num_chunks; ++c) {
      // c % 3 in 32 bits (an item has < 2^31 chunks): one multiply-high, where the 64-bit remainder took
      // ~12 uniform instructions a chunk
      const int buf = Rs::wait_ready(p, s.ready, c), stage = static_cast<int>(static_cast<uint32_t>(c) % kKeyStages);
      tma::wait(&s.loaded[buf], static_cast<uint32_t>((c >> 1) & 1));  // Q, V (the keys: before ready)
      const Slot& slot = s.slot[buf];
      const unsigned char* k = s.k[stage];

      // U^T = S^T K^T and QS^T = S^T Q^T (both done before W: S^T's fragments stay pinned while a
      // product reading them runs, and beside W they would not fit).
      Acc u, o;
      wg::fence();
      {
        const uint64_t k0 = wg::pinned_descriptor<Major::kK>(k, kChunk);
#pragma unroll
        for (int ks = 0; ks < 8; ++ks)
          wg::mma_rs<Elem, 64, Major::kK>(u, st_frag[ks], wg::k_step<Major::kK>(k0, 16 * ks, kChunk), ks > 0);
      }
      if constexpr (kWithO) Rs::issue_qs(o, st_frag, wg::pinned_descriptor<Major::kK>(slot.q, kChunk));
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(u);
      wg::fence_operand(o);
      timeline_mark(p, 1, c, 7);
      // folds_gates(gcum) is re-read where needed: a bool kept across the wgmmas spilled 4 bytes
      const float* gcum = s.gcum[stage];
      Acc vd;
      PartAcc qk;  // Q K^T, this group's 32 key columns (o only)
      {
        Fragments w[4];
        w_fragments(slot.v + group * kPanelBytes, s.decay[stage], u, w);
        timeline_mark(p, 1, c, 8);
        if (!folds_gates(gcum)) {  // (folded: slot.ag holds X', the aux group's)
          // Ag's half from the aux group's X, once W has consumed U^T (beside S^T's pinned fragments
          // or U^T it spills); both halves before Vd reads Ag.
          store_ag_half(s.slot[buf].ag, s.x[buf], gcum, s.beta[stage], group);
          timeline_mark(p, 1, c, 9);
          wg::fence_shared_to_async();
          asm volatile("bar.sync %0, 256;\n" ::"n"(kStateBarrier) : "memory");
        }
        timeline_mark(p, 1, c, 6);
        wg::fence();  // the fragment registers were just written
        {
          const uint64_t ag0 = wg::pinned_descriptor<Major::kK>(slot.ag, kChunk);
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wg::mma_rs<Elem, 64, Major::kK>(vd, w[ks], wg::k_step<Major::kK>(ag0, 16 * ks, kChunk), ks > 0);
        }
        if constexpr (kWithO) {
#pragma unroll
          for (int k0 = 0; k0 < kHeadDim; k0 += 16)
            wg::mma_ss<Elem, 32, Major::kK, Major::kK>(
                qk, wg::descriptor<Major::kK>(slot.q, k0, kChunk),
                wg::descriptor<Major::kK>(k + 32 * group * 128, k0, kChunk), k0 > 0);
        }
        wg::commit();
        // S^T *= e^gamma while Vd^T and Q K^T run (S^T is no operand of theirs; its fragments were read
        // by U^T and QS^T, waited above): off the chain between Vd's wait and the update's issue.
        {
          wg::fence_operand(st);
          const float decay = exp2_approx(gcum[kChunk - 1]);
#pragma unroll
          for (int x = 0; x < 64; ++x) st[x] *= decay;
          wg::fence_operand(st);
        }
        wg::wait<0>();
      }
      wg::fence_operand(vd);
      wg::fence_operand(o);
      wg::fence_operand(qk);
      if constexpr (kWithO) {
        if (folds_gates(gcum))
          store_p_half<true>(s.slot[buf].p, gcum, qk, group);
        else
          store_p_half<false>(s.slot[buf].p, gcum, qk, group);
      }
      timeline_mark(p, 1, c, 2);

      // v4's chunk end; P's halves both written (and fenced) before O += Vd^T P^T reads them.
      const int64_t left = item.eos - (item.bos + c * kChunk);  // the chunk's tokens, if fewer than kChunk
      const typename Rs::ChunkEnd at{
          static_cast<uint32_t>(wg::encode(smem_addr(k))), static_cast<uint32_t>(wg::encode(smem_addr(slot.p))), s.o,
          &s.free[buf], kWithO ? Rs::o_rows(p, item, h, group) + (c - 1) * kChunk * p.o_strides.token : 0, out_lanes};
      Rs::template finish_chunk<kWithO, false, Rs::Fold::kVd, true>(p, item, at, gate_tables(s, stage), c,
                                               left < kChunk ? static_cast<int>(left) : kChunk, h, group, st, st_frag, vd, o, [] {
                                                 if constexpr (kWithO) {
                                                   wg::fence_shared_to_async();
                                                   asm volatile("bar.sync %0, 256;\n" ::"n"(kStateBarrier) : "memory");
                                                 }
                                               }, folds_gates(gcum));
    }
    Rs::template finish_item<kWithO>(p, item, s.o, num_chunks, h, group, st);
  }

  static __device__ void run(const ForwardParams& p, const ForwardTileMaps& maps) {
    Rs::template run_kernel<FusedForwardInv>(p, maps);
  }
};

// kKeepsInverse: the forward keeping the inverse cache (FusedForwardInv's header).
template <typename Elem, bool kKeepsInverse>
__global__ void __launch_bounds__(384, 1) fused_forward_inv_kernel(const __grid_constant__ ForwardParams p,
                                                                   const __grid_constant__ ForwardTileMaps maps) {
  // Without CP the wait comes later, in each role (fused_forward_starts_early). The next grid is
  // released at once: its CTAs find no room on a SM before this one's CTA there has ended (its shared
  // memory and registers), so the release only moves its launch under this grid's work. That is timing
  // only; correctness rests on every kernel that can follow this one reading nothing but the call's
  // inputs before its own wait, which orders its reads after all of this grid's writes (and, through
  // this grid's wait, its predecessor's).
  if (!fused_forward_starts_early(p)) wait_for_previous_grid();
  release_next_grid();
  FusedForwardInv<Elem, kKeepsInverse>::run(p, maps);
}

}  // namespace flashgdn::kern
