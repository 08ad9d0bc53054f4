// Fused chunked forward with the state in registers (v4, sm_90a; FusedKernel::kRegisterState):
// the work items, outputs and checkpoints of fused_forward_ws.cuh and its aux warpgroup, with the
// state groups working on S^T, so that the state and Vd feed their wgmmas as register A operands
// and never pass through shared memory.
//
// Math (fused_forward_ws.cuh, transposed; S [K, V], rows of S^T are value columns):
//   Vd^T [64v, 64t] = V^T Ag^T + S^T (-W~)^T
//   O^T  [64v, 64t] = scale ((S^T Q^T) diag(Gamma) + Vd^T P^T)
//   S^T' [64v, 128] = e^gamma S^T + (Vd^T diag(rho)) K
// An m64nN fp32 accumulator converts to the A fragments of an RS wgmma in registers (element pairs
// 8 ks + 2 q, + 1 are register q of k-step ks: the m16n8k16 A layout), so S^T and Vd^T go from one
// product to the next without shared memory, fences between proxies or barriers.
//
// Grid (N sequences or segments, Hv[, 2 for the CP state pass]), or (1, Hv, N) with the sequence order
// (varlen without CP: the sequences longest first, sequence.cuh heads_fastest); block 384 threads = 3
// warpgroups.
//   aux   (warpgroup 0; setmaxnreg kAuxRegisters): fused_forward_ws.cuh's products P and -W~ fed
//         by TMA: thread 0 issues chunk c's boxes (K, Q with o, V unless zero_v: two 64-column
//         panels each; Ag = G (.) A_r (.) 1 beta^T, which the chunk inverse writes in the input
//         dtype for this kernel (ForwardParams::gated_inverse): one panel, straight into slot.ag)
//         into slot c % 2 on loaded[c % 2].
//         During chunk c it issues chunk c+1's as soon as the state groups free slot (c+1) % 2
//         (after chunk c-1): it polls free between the products and waits only after ready[c % 2].
//         The gates come as the chunk's record written by the chunk inverse (chunk_gates.cuh), by
//         bulk TMA with the boxes: no load into registers (a wgmma fence or proxy fence would wait
//         for it). Per chunk: wait loaded; a partial chunk's rows past its end zeroed (they hold the
//         next sequence or garbage); P (a folded chunk, folds_gates: Q K^T masked, without G);
//         the gate tables scale 2^gcum[t], rho_t, rho_t 2^-gamma and 2^gcum[t] (write_gate_tables);
//         -B~ = -Ag diag(Gamma) from Ag's fragments (ldmatrix) and the last table; -W~; ready[c % 2].
//   state (warpgroups 1, 2 = groups g 0, 1; setmaxnreg kStateRegisters): value rows v = 64 g ..
//         64 g + 63 of S^T as one m64n128 fp32 accumulator (64 registers) for the whole item, and
//         its Elem (bf16 / fp16) A fragments. Per chunk c, after ready[c % 2]:
//           Vd^T [64,64] = V^T[64,64] @ Ag^T (SS, 4 x m64n64k16; V's panel g as M-major A)
//                        + S^T[64,128] @ (-W~)^T (RS, 8)
//           QS^T [64,64] = S^T @ Q^T (RS, 8; o only)
//           Vd^T -> A fragments (plain, and rho-scaled by column); S^T *= e^gamma; QS^T columns *= Gamma
//                  (a folded chunk: O's fragments of Vd^T diag(2^-gcum) for the plain ones, QS^T untouched,
//                  and o's columns *= Gamma once O's wgmma is done, before free: G = diag(2^gcum) . diag(2^-gcum))
//           S^T += (rho Vd)^T @ K (RS, 4 x m64n128k16, K as N-major B); in the kExactUpdate kernel
//                  (the backward's pre-pass, no o) 4 more with the operand's low part
//           O^T += Vd^T @ P^T (RS, 4; o only)                          -- chunk c-1's o leaves
//                                                                       o[(c-1) % 2] under these
//           free[c % 2]; S^T -> A fragments; o -> o[c % 2] (stmatrix.trans: rows = tokens);
//           checkpoint; group barrier (o written before the next chunk's copy)
// Shared memory (196 KiB): slots [2] (fused_forward_ws.cuh); o [2][64 tokens][128] (panel g =
// group g's columns; without o, o[g] stages group g's S^T for chunk_states); gcum, beta, o_scale, rho,
// fold, decay [2][64] fp32 (o_scale, rho, fold, decay: the aux group's gate tables); mbarriers
// ready[2] (128 arrivals), free[2] (256), loaded[2] (1 + TMA bytes).
// Named barriers: 1 the aux group, 2 + g state group g.
// The backward's chunk-state pass (p.chunk_states, no o): at the top of chunk c each state group
// stages S^T's Elem fragments (the state entering the chunk) in its o staging, which one of its
// threads stores to chunk_states by TMA (ForwardTileMaps::states) under the chunk's first wgmmas; at
// a sequence's last chunk, with p.final_grad, it also sums <dS_T, S> with S in fp32
// (store_final_grad_dot).
#pragma once

#include "kernels/sm90/fused_forward_ws.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/tensor_map.h"

namespace flashgdn::kern {

// Early start of v4 and v5 (no CP): the kernel's CTAs may run while the previous kernel of the stream (the
// chunk inverse or the gate records) drains, so the item's lookups and the initial state's loads (~14k cycles
// at a wave's start, timeline 08a9f64) overlap it: they read only the call's inputs and tables written two or
// more kernels back (complete: the previous kernel waits for them before it releases this one; so an
// early-start kernel must not directly follow another that releases before its wait, such as v5, where it
// reads what that one's predecessor writes). Each role waits before what the previous kernel writes: the aux
// before chunk 0's tiles (aux_loop), the state groups after the initial state (start_item; they read only
// what the aux's tiles bring). With CP the kernel waits first: the main pass starts from cp_correction's
// states, the state pass's items read cp_windows' windows.
// Not where the previous kernel writes the item tables (p.item_tables_pending: the backward with the
// inverse cache runs its pre-pass right after item_offsets).
__device__ __forceinline__ bool fused_forward_starts_early(const ForwardParams& p) {
  return p.cp_pass == kNoCp && !p.item_tables_pending;
}

template <typename Elem, typename InverseT>
struct FusedForwardRs {
  using Aux = FusedForwardWs<Elem, InverseT>;
  using Tiles = FusedForwardWg<Elem, InverseT>;  // accumulator coordinates, o copy
  using Slot = typename Aux::Slot;
  static constexpr int kThreads = 384;
  // 184 state registers spill S^T's fragments (64 + 32 + 2 x 32 pinned by the first wgmmas, plus
  // addresses); the aux group fits in 120 with the bf16 inverse only (the launcher refuses fp32).
  static constexpr int kAuxRegisters = 120, kStateRegisters = 192;
  static_assert(!std::is_same_v<InverseT, float>, "the aux group spills in 120 registers with an fp32 inverse");
  // setmaxnreg moves registers within the CTA's launch allocation, 168 per thread (64K over 384
  // threads, rounded down to 8): a state group asking for more than the aux group gave up waits forever.
  static_assert(kAuxRegisters + 2 * kStateRegisters <= 3 * 168, "more than the CTA's registers");
  static constexpr int kTokenTileBytes = Tiles::kTokenTileBytes;
  static constexpr int kPanelBytes = Tiles::kPanelBytes;
  using Major = wg::Major;
  using Acc = float[32];         // m64n64 accumulator
  using StateAcc = float[64];    // m64n128 accumulator: S^T rows 64 g .., all 128 key columns
  using Fragments = uint32_t[4];  // A of one k-step

  struct SharedStorage {
    Slot slot[2];
    alignas(1024) unsigned char o[2][kTokenTileBytes];
    alignas(16) float gcum[2][kChunk];
    alignas(16) float beta[2][kChunk];
    alignas(16) float o_scale[2][kChunk];  // p.scale 2^gcum[t]       (the aux group, from gcum: write_gate_tables)
    alignas(16) float rho[2][kChunk];      // 2^(gcum[63] - gcum[t])
    alignas(16) float fold[2][kChunk];     // rho_t 2^-gcum[63] = 2^-gcum[t]  (a folded chunk's O operand)
    alignas(16) float decay[2][kChunk];    // 2^gcum[t]                (the aux group's own: -B~'s column factors)
    alignas(8) uint64_t ready[2];
    alignas(8) uint64_t free[2];
    alignas(8) uint64_t loaded[2];
  };
  static_assert(sizeof(SharedStorage) <= 232448, "above the 227 KiB of shared memory a block may opt in to");

  // Folded chunks (bf16 operands only; v4 and v5): those whose decay -gamma (log2 units) is at most
  // kFoldedDecayLog2, where the factors 2^-gcum[t] (<= 2^-gamma) that fold the gates out of P (and in
  // v5 out of Ag) stay far inside bf16's and fp32's range (2^127) times any entry; stronger-decaying
  // chunks (and fp16 operands, whose range ends at 2^16) keep the gates inside. Every role decides
  // from the same gcum[63].
  static constexpr float kFoldedDecayLog2 = 64.f;
  static __device__ __forceinline__ bool folds_gates(const float* gcum) {
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return gcum[kChunk - 1] >= -kFoldedDecayLog2;
    return false;
  }
  // What a folded chunk end (finish_chunk) receives: v5's Vd' = Vd diag(2^-gcum) (its Ag folded too)
  // or v4's Vd itself (only P folded).
  enum class Fold { kVd, kP };

  // unpack_pair with bf16's upper half by a mask (one LOP3) and its lower by a shift: __bfloat1622float2
  // moves the upper half down and back up (PRMT + shift). The same values.
  static __device__ __forceinline__ float2 unpack(uint32_t bits) {
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
      return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
    else
      return unpack_pair<Elem>(bits);
  }

  // ---- aux group ------------------------------------------------------------------------------

  // Rows rows..63 of the `panels` 64-row panels at `tiles` (each kPanelBytes apart) set to zero (a
  // swizzled row keeps its 128 bytes): thread t of the group writes 16-byte unit t % 8 of rows
  // rows + t / 8 + 16 k (k < 4) of each panel, predicated stores with no division by the run-time
  // unit count (a partial chunk's four calls took ~90 instructions a 16-byte unit).
  static __device__ __forceinline__ void zero_rows(unsigned char* tiles, int panels, int rows) {
    const int t = threadIdx.x % 128;
    unsigned char* first = tiles + (rows + t / 8) * 128 + (t % 8) * 16;
    for (int panel = 0; panel < panels; ++panel)
#pragma unroll
      for (int k = 0; k < kChunk / 16; ++k)
        if (rows + t / 8 + 16 * k < kChunk)
          *reinterpret_cast<uint4*>(first + panel * kPanelBytes + 16 * k * 128) = make_uint4(0, 0, 0, 0);
  }

  // This thread's A fragments of a [64][64] swizzled panel (fused_forward_ws.cuh's layout): k-step ks
  // is ldmatrix.x4 of rows 16 w + lane % 16, columns 16 ks + 8 (lane / 16).
  static __device__ __forceinline__ void panel_fragments(const unsigned char* panel, uint32_t (&frag)[4][4]) {
    const int lane = threadIdx.x % 32, row = 16 * ((threadIdx.x / 32) % 4) + lane % 16;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) ldmatrix_x4(frag[ks], panel + wg::swizzled_offset(row, 16 * ks + 8 * (lane / 16)));
  }

  // P and -W~ of chunk c into `slot` (Ag arrived there from the chunk inverse, gated): -B~ = -Ag
  // diag(Gamma), Ag's fragments with column t scaled by -e^{g_t}, read from the decay table
  // (write_gate_tables: one ex2 a thread, not 16; the group's barrier after between()). between()
  // runs after P.
  // P = |scale| G (.) QK^T with log2_scale = log2 |scale| in its exponent (no multiply), o's other term
  // taking scale from the o_scale table (GatesFromTables; finish_chunk negates P's operand for a
  // negative scale); a folded chunk's P stays unscaled (its o columns take scale 2^gcum after O's wgmmas).
  template <typename Between>
  static __device__ __forceinline__ void chunk_products(const ForwardParams& p, Slot& slot, const float* gcum,
                                                        const float* decay, float log2_scale, bool with_o, int64_t c,
                                                        Between&& between) {
    if (with_o) {
      if (folds_gates(gcum)) {
        const float no_rows[2] = {}, no_cols[16] = {};  // P without its gates reads neither
        Aux::template product_p<false>(slot, no_rows, no_cols);
      } else {  // the gates' rows and columns, loaded only here (before the branch: 12 instructions a folded chunk)
        const int r = Tiles::acc_row(0);
        const float g_rows[2] = {gcum[r] + log2_scale, gcum[r + 8] + log2_scale};
        float g_col[16];
        Aux::column_values(gcum, g_col);
        Aux::product_p(slot, g_rows, g_col);
      }
    }
    timeline_mark(p, 0, c, 4);
    between();
    Aux::group_sync(Aux::kAuxBarrier);  // the decay table written
    float decay_col[16];
    Aux::column_values(decay, decay_col);
    uint32_t b_tilde[4][4];
    panel_fragments(slot.ag, b_tilde);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int at = 4 * ks + 2 * (q / 2);  // columns 16 ks + 8 (q / 2) + c_lane (+ 1)
        const float2 ag = unpack(b_tilde[ks][q]);
        b_tilde[ks][q] = pack_pair<Elem>(-decay_col[at] * ag.x, -decay_col[at + 1] * ag.y);
      }
    timeline_mark(p, 0, c, 5);
    Aux::product_w_neg(slot, b_tilde);
    timeline_mark(p, 0, c, 6);
  }

  // The aux group's loop over its item's chunks on the TMA ring (v4 here, the backward's dS pass in
  // backward_ds_pass.cuh; v5 has its own, with the keys a chunk further ahead): make_item() gives the
  // item (pure, recomputed per role: v4 and v5 work_item, the dS pass its backward item); with
  // kReverse the chunks run last to first (step c of the loop is chunk n - 1 - c; "chunk c" below is
  // step c). Thread 0 issues chunk c's boxes (K, Q with o, V unless zero_v: two
  // 64-column panels each; Ag with kLoadAg) and gate record into slot c % 2 on loaded[c % 2], and
  // chunk c+1's as soon as the state groups have freed slot (c+1) % 2 (after chunk c-1): it polls
  // free whenever the chunk's work calls issue_next_if_free and waits for it only after ready[c % 2].
  // Per chunk: wait loaded; a partial chunk's rows past its end zeroed; work(c, buf,
  // issue_next_if_free) (the chunk's products, fenced for the async proxy where wgmmas read them);
  // ready; then chunk c+1's loads if not issued yet (waiting for the slot).
  template <bool kLoadAg, bool kReverse = false, typename Storage, typename MakeItem, typename Work>
  static __device__ __forceinline__ void aux_loop(const ForwardParams& p, const ForwardTileMaps& maps, Storage& s,
                                                  bool with_o, int hk, int h, MakeItem&& make_item, Work&& work) {
    timeline_mark(p, 0, 0, 10);
    if (threadIdx.x == 0) {  // the descriptors' fetch under the work item's lookups
      tma::prefetch_map(&maps.k);
      if (with_o) tma::prefetch_map(&maps.q);
      tma::prefetch_map(&maps.v);
      if constexpr (kLoadAg) tma::prefetch_map(&maps.inverse);
    }
    const WorkItem item = make_item();
    const int num_chunks = static_cast<int>((item.eos - item.bos + kChunk - 1) / kChunk);
    const auto chunk_at = [&](int c) { return kReverse ? num_chunks - 1 - c : c; };
    // The one chunk that may be partial, the item's last in token order: step zero_step of the loop
    // (-1 where it is full) with last_rows rows: per chunk one compare, no 64-bit row math.
    const int last_rows = static_cast<int>(item.eos - item.bos - static_cast<int64_t>(num_chunks - 1) * kChunk);
    const int zero_step = num_chunks > 0 && last_rows < kChunk ? (kReverse ? 0 : num_chunks - 1) : -1;
    const int b = static_cast<int>(item.batch);
    const bool load_v = !item.zero_v;
    if (threadIdx.x == 0) {
      tma::barrier_init(&s.loaded[0], 1);
      tma::barrier_init(&s.loaded[1], 1);
      tma::fence_barrier_init();
    }
    if (!load_v)  // V = 0 (the CP state pass's transition items): never loaded
      for (int i = 0; i < 2; ++i) zero_rows(s.slot[i].v, 2, 0);
    Aux::group_sync(Aux::kAuxBarrier);

    constexpr uint32_t kGateBytes = kChunk * sizeof(float);
    const uint32_t bytes =
        kPanelBytes * ((kLoadAg ? 3 : 2) + (with_o ? 2 : 0) + (load_v ? 2 : 0)) + 2 * kGateBytes;
    auto issue = [&](int c) {  // thread 0: chunk c's boxes and gate record into slot c % 2
      const int buf = c & 1, t0 = static_cast<int>(item.bos + static_cast<int64_t>(chunk_at(c)) * kChunk);
      auto& slot = s.slot[buf];
      uint64_t* loaded = &s.loaded[buf];
      const float* record = p.chunk_gates + ((item.first_chunk_id + chunk_at(c)) * p.num_v_heads + h) * 2 * kChunk;
      tma::arrive_expect_bytes(loaded, bytes);
      tma::load_bulk(s.gcum[buf], record, kGateBytes, loaded);
      tma::load_bulk(s.beta[buf], record + kChunk, kGateBytes, loaded);
      if constexpr (kLoadAg) tma::load_4d(slot.ag, &maps.inverse, loaded, 0, h, t0, b);
      for (int panel = 0; panel < 2; ++panel) {
        tma::load_4d(slot.k + panel * kPanelBytes, &maps.k, loaded, 64 * panel, hk, t0, b);
        if (with_o) tma::load_4d(slot.q + panel * kPanelBytes, &maps.q, loaded, 64 * panel, hk, t0, b);
        if (load_v) tma::load_4d(slot.v + panel * kPanelBytes, &maps.v, loaded, 64 * panel, h, t0, b);
      }
    };
    timeline_mark(p, 0, 1, 10);
    if (fused_forward_starts_early(p)) wait_for_previous_grid();  // the tiles read the chunk inverse's output
    if (num_chunks > 0 && threadIdx.x == 0) issue(0);
    timeline_mark(p, 0, 1, 11);
#pragma unroll 1
    for (int c = 0; c < num_chunks; ++c) {
      const int buf = c & 1;
      auto& slot = s.slot[buf];
      // Thread 0: chunk c+1 into slot buf ^ 1 once chunk c-1 has left it (no waiting here); the
      // others' next_issued is true throughout (one flag to test)
      bool next_issued = threadIdx.x != 0 || c + 1 >= num_chunks;
      auto issue_next_if_free = [&] {
        if (!next_issued &&
            (c == 0 || tma::test_wait(&s.free[buf ^ 1], static_cast<uint32_t>(((c - 1) >> 1) & 1)))) {
          issue(c + 1);
          next_issued = true;
        }
      };
      timeline_mark(p, 0, c, 0);
      issue_next_if_free();
      timeline_mark(p, 0, c, 1);
      tma::wait(&s.loaded[buf], static_cast<uint32_t>((c >> 1) & 1));
      if (c == zero_step) {  // the last chunk of a sequence: its rows past the end, zero
        zero_rows(slot.k, 2, last_rows);
        if (with_o) zero_rows(slot.q, 2, last_rows);
        if (load_v) zero_rows(slot.v, 2, last_rows);
        if constexpr (kLoadAg) zero_rows(slot.ag, 1, last_rows);
        wg::fence_shared_to_async();  // the zeroed rows, for the wgmmas below
        Aux::group_sync(Aux::kAuxBarrier);
      }
      timeline_mark(p, 0, c, 2);
      work(c, buf, issue_next_if_free);
      tma::arrive(&s.ready[buf]);
      timeline_mark(p, 0, c, 7);
      if (!next_issued) {
        if (c >= 1) tma::wait(&s.free[buf ^ 1], static_cast<uint32_t>(((c - 1) >> 1) & 1));
        issue(c + 1);
      }
      __syncwarp();
    }
    timeline_mark(p, 0, 0, 11);
  }

  // Aux thread i into slot buf's tables: o_scale = p.scale 2^gcum[i] and decay = 2^gcum[i] (i < 64), or
  // rho = 2^(gamma - gcum[i - 64]) and fold = rho 2^-gamma (GatesFromTables, read by the state groups
  // after ready; decay: chunk_products' -B~). Two ex2 a thread here instead of 32 a state thread (and a
  // folded chunk's ex2 and 16 multiplies there, which formed rho 2^-gamma alike).
  static __device__ __forceinline__ void write_gate_tables(SharedStorage& s, int buf, float scale) {
    const int i = threadIdx.x % 128, t = i % kChunk;
    const float g = s.gcum[buf][t];
    if (i < kChunk) {
      const float decay = exp2_approx(g);
      s.decay[buf][t] = decay;
      s.o_scale[buf][t] = scale * decay;
    } else {
      const float gamma = s.gcum[buf][kChunk - 1], rho = exp2_approx(gamma - g);
      s.rho[buf][t] = rho;
      s.fold[buf][t] = rho * exp2_approx(-gamma);
    }
  }

  // v4's aux group: P and -W~ of each chunk (chunk_products) on the ring, Ag loaded with the tiles.
  static __device__ __forceinline__ void run_aux(const ForwardParams& p, const ForwardTileMaps& maps,
                                                 SharedStorage& s, bool with_o, int hk, int h) {
    float log2_scale = __log2f(fabsf(p.scale));
    asm volatile("" : "+f"(log2_scale));  // once per item, not per chunk
    aux_loop<true>(p, maps, s, with_o, hk, h, [&] { return block_work_item(p); },
                   [&](int64_t c, int buf, auto&& issue_next_if_free) {
      timeline_mark(p, 0, c, 3);
      write_gate_tables(s, buf, p.scale);
      chunk_products(p, s.slot[buf], s.gcum[buf], s.decay[buf], log2_scale, with_o, c, issue_next_if_free);
      wg::fence_shared_to_async();  // the products, for the state groups' wgmmas
    });
  }

  // ---- state groups ---------------------------------------------------------------------------

  // Element 4 j + e of S^T's accumulator is S[k][v], k = acc_col(j, e), v = col0 + acc_row(e). The
  // case is decided once per item and a stored state's 64 values a thread are loaded back to back
  // (one branch-free run of independent loads): decided per element, the loads went out one after
  // another, ~24k cycles before an item's first chunk (timeline b6191da).
  static __device__ void load_initial_state(const WorkItem& item, int col0, StateAcc& st) {
    if (item.initial_identity) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[4 * j + e] = Tiles::acc_col(j, e) == col0 + Tiles::acc_row(e) ? 1.f : 0.f;
    } else if (item.initial.base == nullptr) {
#pragma unroll
      for (int x = 0; x < 64; ++x) st[x] = 0.f;
    } else if (item.initial.bf16) {
      load_stored_state<__nv_bfloat16>(item.initial, col0, st);
    } else {
      load_stored_state<float>(item.initial, col0, st);
    }
  }
  // A stored block's layout: the dense [K][V] and [V][K] blocks of a contiguous states tensor (and
  // the CP and backward workspaces) have their strides known at compile time, so that each of a
  // thread's 64 elements is its first plus an immediate (one load or store an element); any other
  // strides take four pointers a thread, each advanced by 8 k-rows a step (a 64-bit add more an
  // element). An item's start and end run once, on a cold instruction cache.
  enum class StateLayout { kStrided, kKV, kVK };
  static __device__ __forceinline__ StateLayout state_layout(const StateBlock& block) {
    if (block.k_stride == kHeadDim && block.v_stride == 1) return StateLayout::kKV;
    if (block.k_stride == 1 && block.v_stride == kHeadDim) return StateLayout::kVK;
    return StateLayout::kStrided;
  }
  // visit(x, at): element x = 4 j + e of S^T's accumulator, S[k][v] with k = acc_col(j, e) =
  // acc_col(0, 0) + 8 j + e % 2 and v = col0 + acc_row(e) = col0 + acc_row(0) + 8 (e / 2), lies at `at`.
  template <typename T, StateLayout kLayout, typename Visit>
  static __device__ __forceinline__ void visit_state(const StateBlock& block, int col0, Visit&& visit) {
    T* const base = static_cast<T*>(block.base);
    if constexpr (kLayout == StateLayout::kStrided) {
      T* at[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        at[e] = base + (Tiles::acc_col(0, e) * block.k_stride + (col0 + Tiles::acc_row(e)) * block.v_stride);
      const int64_t step = 8 * block.k_stride;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          visit(4 * j + e, at[e]);
          at[e] += step;
        }
    } else {
      constexpr int k_stride = kLayout == StateLayout::kKV ? kHeadDim : 1;
      constexpr int v_stride = kLayout == StateLayout::kKV ? 1 : kHeadDim;
      T* const first = base + (Tiles::acc_col(0, 0) * k_stride + (col0 + Tiles::acc_row(0)) * v_stride);
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) visit(4 * j + e, first + ((8 * j + e % 2) * k_stride + 8 * (e / 2) * v_stride));
    }
  }
  // A stored state's 64 values a thread, loaded back to back, then converted.
  template <typename T>
  static __device__ __forceinline__ void load_stored_state(const StateBlock& from, int col0, StateAcc& st) {
    switch (state_layout(from)) {
      case StateLayout::kKV: return load_stored_state<T, StateLayout::kKV>(from, col0, st);
      case StateLayout::kVK: return load_stored_state<T, StateLayout::kVK>(from, col0, st);
      default: return load_stored_state<T, StateLayout::kStrided>(from, col0, st);
    }
  }
  template <typename T, StateLayout kLayout>
  static __device__ __forceinline__ void load_stored_state(const StateBlock& from, int col0, StateAcc& st) {
    T raw[64];
    visit_state<T, kLayout>(from, col0, [&](int x, const T* at) { raw[x] = *at; });
#pragma unroll
    for (int x = 0; x < 64; ++x) {
      if constexpr (std::is_same_v<T, float>)
        st[x] = raw[x];
      else
        st[x] = __bfloat162float(raw[x]);
    }
  }
  // A state (the final state, the dS pass's ds_start) from S^T's accumulator, as load_stored_state
  // reads one, the element type and the layout decided once.
  static __device__ void store_state(const StateBlock& out, int col0, const StateAcc& st) {
    if (out.bf16)
      store_stored_state<__nv_bfloat16>(out, col0, st);
    else
      store_stored_state<float>(out, col0, st);
  }
  template <typename T>
  static __device__ __forceinline__ void store_stored_state(const StateBlock& to, int col0, const StateAcc& st) {
    switch (state_layout(to)) {
      case StateLayout::kKV: return store_stored_state<T, StateLayout::kKV>(to, col0, st);
      case StateLayout::kVK: return store_stored_state<T, StateLayout::kVK>(to, col0, st);
      default: return store_stored_state<T, StateLayout::kStrided>(to, col0, st);
    }
  }
  template <typename T, StateLayout kLayout>
  static __device__ __forceinline__ void store_stored_state(const StateBlock& to, int col0, const StateAcc& st) {
    visit_state<T, kLayout>(to, col0, [&](int x, T* at) {
      if constexpr (std::is_same_v<T, float>)
        *at = st[x];
      else
        *at = __float2bfloat16_rn(st[x]);
    });
  }
  // A checkpoint (fp32) by the strided path only: it is stored inside the chunk loop, whose code the
  // layout cases would lengthen (by ~160 instructions) where it runs once per checkpoint_chunks chunks.
  static __device__ void store_checkpoint(const ForwardParams& p, const WorkItem& item, int64_t c, int rows, int h,
                                          int col0, const StateAcc& st) {
    if (item.write_checkpoints && rows == kChunk && (item.chunks_before + c + 1) % p.checkpoint_chunks == 0)
      store_stored_state<float, StateLayout::kStrided>(
          checkpoint_state(p, item.sequence, (item.chunks_before + c + 1) / p.checkpoint_chunks - 1, h), col0, st);
  }

  // The per-token gate scales of a chunk's end, from its gcum (log2 units): o's column factors and
  // rho_t = 2^(gamma - gcum[t]) (Vd's rows into the state), gamma = gcum[63], as the tables v4's aux
  // group writes (write_gate_tables; v5's: FusedForwardInv::GateTables). kScaledDecay: decay_pair is
  // p.scale 2^gcum[t], o's whole column factor, and P carries |p.scale| (chunk_products), so o is staged
  // as it is (v5: 2^gcum[t], o scaled as staged). fold_t: 2^-gcum[t] = rho_t 2^-gamma (a folded chunk's).
  struct GatesFromTables {
    static constexpr bool kScaledDecay = true;
    const float* gcum;
    const float* o_scale_t;
    const float* rho_t;
    const float* fold_t;
    __device__ __forceinline__ float gamma() const { return gcum[kChunk - 1]; }
    __device__ __forceinline__ float2 decay_pair(int t) const { return *reinterpret_cast<const float2*>(o_scale_t + t); }
    __device__ __forceinline__ float2 rho_pair(int t) const { return *reinterpret_cast<const float2*>(rho_t + t); }
    __device__ __forceinline__ float2 fold_pair(int t) const { return *reinterpret_cast<const float2*>(fold_t + t); }
    __device__ __forceinline__ float scaled_decay(int t, float) const { return o_scale_t[t]; }
  };

  // The shared memory a state group's chunk end reads and writes (v4 here, v5 in
  // fused_forward_inv.cuh): the chunk's K and P tiles (their shared addresses / 16, wg::encode: the
  // words of their descriptors), the o staging pair and the slot's free barrier; and this thread's o
  // vectors in chunk c - 1, whose o leaves under the chunk's update (o_rows: o_rows() plus c - 1 chunks
  // of token strides) and o panel offsets (o_lanes), with o.
  struct ChunkEnd {
    uint32_t k_word;
    uint32_t p_word;
    unsigned char (*o)[kTokenTileBytes];
    uint64_t* free;
    int64_t o_rows;
    uint32_t o_lanes;
  };

  // A state group's o copy: its 64 columns of a chunk's tokens, staged in an o panel, to o in 16-byte
  // vectors, thread t copying vector t % 8 of rows t / 8 + 16 i (i < 4). Its rows share their swizzle
  // (row % 8): the shared addresses are its first plus 16 rows (immediates), the global ones its first
  // plus 16 i token strides. o_rows: the element offset in o of this thread's first vector in the
  // item's chunk 0, opaque so that a chunk's copy adds chunks of token strides to it rather than
  // re-deriving it from the chunk's first token and the thread's row (64-bit products each chunk).
  // v4 forms it once per item and advances it a chunk a step (one 64-bit add); v5 at each chunk end
  // (kept across its loop, the register pair spilled v5's fp16 kernel).
  static __device__ __forceinline__ int64_t o_rows(const ForwardParams& p, const WorkItem& item, int h, int group) {
    const int t = threadIdx.x % 128;
    const int64_t stride = p.o_strides.token;
    int64_t rows = item.batch * p.o_strides.batch + item.bos * stride + h * p.o_strides.head + 64 * group +
                   ((t / 8) * stride + (t % 8) * 8);
    asm volatile("" : "+l"(rows));
    return rows;
  }
  // This thread's byte offsets in an o panel, opaque as o_rows: the low 16 bits its stmatrix.trans
  // row of the staging (stage_o), the high 16 its first vector of the copy (copy_o). Both are the
  // same for every chunk: the staging's column blocks 2 jj are 16 jj rows on, the copy's vectors 16
  // rows on, with the lane's swizzle (row % 8) unchanged. v4 and v5 form them once per item (one
  // register; formed at each chunk end they cost v5 more than the offsets save).
  static __device__ __forceinline__ uint32_t o_lanes() {
    const int t = threadIdx.x % 128, lane = t % 32, m = lane / 8;
    uint32_t lanes = wg::swizzled_offset(8 * (m / 2) + lane % 8, 16 * (t / 32) + 8 * (m % 2)) |
                     wg::swizzled_offset(t / 8, (t % 8) * 8) << 16;
    asm volatile("" : "+r"(lanes));
    return lanes;
  }
  // Tiles::store_transposed<64> of o (element 4 j + e = value(j, e)) into a group's o panel.
  template <typename F>
  static __device__ __forceinline__ void stage_o(unsigned char* panel, uint32_t o_lanes, F&& value) {
    unsigned char* const rows = panel + (o_lanes & 0xffffu);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      uint32_t regs[4];
      Tiles::pack_x4(regs, j, value);
      stmatrix_x4_trans(rows + 8 * j * 128, regs);
    }
  }
  // Rows 0 .. rows - 1 of a chunk's staged o panel; o_rows: this thread's first vector in the chunk.
  static __device__ __forceinline__ void copy_o(const ForwardParams& p, const unsigned char* panel, int64_t o_rows,
                                                uint32_t o_lanes, int rows) {
    const int row = (threadIdx.x % 128) / 8;
    const int64_t stride = p.o_strides.token;
    Elem* const out = static_cast<Elem*>(p.o) + o_rows;
    const unsigned char* src = panel + (o_lanes >> 16);
#pragma unroll
    for (int i = 0; i < kChunk / 16; ++i)
      if (row + 16 * i < rows)
        *reinterpret_cast<uint4*>(out + i * 16 * stride) = *reinterpret_cast<const uint4*>(src + i * 16 * 128);
  }

  // A state group's chunk c from Vd^T and QS^T on: (rho Vd)^T and Vd^T (kExactUpdate, without o: the
  // low part of (rho Vd)^T, rho Vd - bf16(rho Vd)) as A fragments, QS^T columns
  // *= Gamma, S^T *= e^gamma (Vd^T and QS^T share the m64n64 layout: element x = 8 ks + 2 q (+ 1) is
  // column (token) 16 ks + 8 (q / 2) + c_lane (+ 1); the gates are read only now: beside S^T's pinned
  // fragments their registers would not fit; Gates: GatesFromTables or v5's GateTables); before_update();
  // S^T += (rho Vd)^T K and O^T += Vd^T P^T; chunk c-1's o out under them; free; S^T's fragments, o
  // staged, the checkpoint (rows: the chunk's tokens, kChunk but in an item's last chunk).
  // folded (a folded chunk, never with kExactUpdate): P is Q K^T masked without its gates, so
  // O^T = (QS^T + Vd^T diag(2^-gcum) P^T) diag(2^gcum): QS^T keeps its columns until the update's
  // wgmmas are done, then they take 2^gcum (the same count of multiplies, after the update instead of
  // before it: v4 before free, v5 as o is staged). kFold:
  // Fold::kVd (v5) where vd holds Vd' = Vd diag(2^-gcum) already: (rho Vd)^T = 2^gamma Vd'^T (one
  // factor) and Vd'^T is O's operand as it is; Fold::kP (v4) where vd is Vd: O's operand is Vd^T
  // diag(rho 2^-gamma) (rho from the gates, as the update's).
  template <bool kWithO, bool kExactUpdate, Fold kFold = Fold::kP, bool kStateDecayed = false, typename Gates,
            typename BeforeUpdate>
  static __device__ __forceinline__ void finish_chunk(const ForwardParams& p, const WorkItem& item, const ChunkEnd& at,
                                                      const Gates& gates, int64_t c, int rows, int h, int group,
                                                      StateAcc& st, Fragments (&st_frag)[8], Acc& vd, Acc& o,
                                                      BeforeUpdate&& before_update, bool folded = false) {
    const int c_lane = 2 * (threadIdx.x % 4), col0 = 64 * group;
    Fragments vd_decayed[4], vd_plain[4];
    if (kWithO && kFold == Fold::kP && folded) {
      if constexpr (kFold == Fold::kP) {  // (GatesFromTables: 2^-gcum[t] = rho_t 2^-gamma from the aux)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int t = 16 * ks + 8 * half + c_lane;
            const float2 rho = gates.rho_pair(t), inv_decay = gates.fold_pair(t);
#pragma unroll
            for (int q = 2 * half; q < 2 * half + 2; ++q) {
              const int x = 8 * ks + 2 * q;
              vd_decayed[ks][q] = pack_pair<Elem>(rho.x * vd[x], rho.y * vd[x + 1]);
              vd_plain[ks][q] = pack_pair<Elem>(inv_decay.x * vd[x], inv_decay.y * vd[x + 1]);
            }
          }
      }
    } else if (kFold == Fold::kVd && folded) {
      // vd holds (rho Vd)^T (X'' = X diag(beta rho)); O's operand is the same fragments, its
      // 2^-gamma carried by P
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int x = 8 * ks + 2 * q;
          vd_decayed[ks][q] = pack_pair<Elem>(vd[x], vd[x + 1]);
          if constexpr (kWithO) vd_plain[ks][q] = vd_decayed[ks][q];
        }
    } else {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * ks + 8 * half + c_lane;  // the pair's tokens t, t + 1
        const float2 rho = gates.rho_pair(t);
        [[maybe_unused]] const float2 decay_t = kWithO ? gates.decay_pair(t) : float2{};
#pragma unroll
        for (int q = 2 * half; q < 2 * half + 2; ++q) {
          const int x = 8 * ks + 2 * q;
          const float decayed[2] = {rho.x * vd[x], rho.y * vd[x + 1]};
          vd_decayed[ks][q] = pack_pair<Elem>(decayed[0], decayed[1]);
          if constexpr (kWithO) {
            vd_plain[ks][q] = pack_pair<Elem>(vd[x], vd[x + 1]);
            o[x] *= decay_t.x;
            o[x + 1] *= decay_t.y;
          } else if constexpr (kExactUpdate) {  // the update operand's rounding error
            const float2 hi = unpack(vd_decayed[ks][q]);
            vd_plain[ks][q] = pack_pair<Elem>(decayed[0] - hi.x, decayed[1] - hi.y);
          }
        }
      }
      if constexpr (kWithO && Gates::kScaledDecay) {
        if (p.scale < 0.f) {  // P carries |scale|: O's operand -Vd^T (sign bits)
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int q = 0; q < 4; ++q) vd_plain[ks][q] ^= 0x80008000u;
        }
      }
    }
    if constexpr (!kStateDecayed) {  // (kStateDecayed: the caller scaled S^T already, under its Vd wgmmas)
      const float decay = exp2_approx(gates.gamma());
#pragma unroll
      for (int x = 0; x < 64; ++x) st[x] *= decay;
    }
    before_update();
    wg::fence();
    const uint64_t k0 = wg::pinned_descriptor_from_word<Major::kMN>(at.k_word, kChunk);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_rs<Elem, 128, Major::kMN>(st, vd_decayed[ks], wg::k_step<Major::kMN>(k0, 16 * ks, kChunk), true);
    if constexpr (kExactUpdate) {  // S^T += (rho Vd - hi)^T K: the operand to ~2^-16
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma_rs<Elem, 128, Major::kMN>(st, vd_plain[ks], wg::k_step<Major::kMN>(k0, 16 * ks, kChunk), true);
    }
    if constexpr (kWithO) {
      const uint64_t p0 = wg::pinned_descriptor_from_word<Major::kK>(at.p_word, kChunk);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma_rs<Elem, 64, Major::kK>(o, vd_plain[ks], wg::k_step<Major::kK>(p0, 16 * ks, kChunk), true);
    }
    wg::commit();
    // Chunk c-1's o (a full chunk) leaves under these wgmmas (under the first ones it would not
    // fit in the registers beside S^T's pinned fragments).
    timeline_mark(p, 1, c, 3);
    if (kWithO && c > 0) copy_o(p, at.o[(c - 1) & 1] + group * kPanelBytes, at.o_rows, at.o_lanes, kChunk);
    wg::wait<0>();
    wg::fence_operand(st);
    wg::fence_operand(o);
    timeline_mark(p, 1, c, 4);
    if (kWithO && kFold == Fold::kP && folded) {
      // v4: o's columns take scale 2^gcum before free (its gates live in the slot, which free hands
      // to the aux's next loads), in one pass of pair loads
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // elements 4 j + e: columns 8 j + c_lane + e % 2
        const float2 decay_t = gates.decay_pair(8 * j + c_lane);
        o[4 * j] *= decay_t.x, o[4 * j + 1] *= decay_t.y, o[4 * j + 2] *= decay_t.x, o[4 * j + 3] *= decay_t.y;
      }
    }
    tma::arrive(at.free);  // every read of the slot (wgmma operands, gates) is done

    wg::to_fragments<Elem, 8>(st, st_frag);
    if constexpr (kWithO) {
      // v5: o's columns take 2^gcum as they are staged, after free (its tables live in the key stage,
      // rewritten only after the next chunk's free). The same pass before free, as v4's, measured
      // +0.7..+2.7% on v5's kernel (session 30, candidate-s77 against candidate-s74).
      unsigned char* const staging = at.o[c & 1] + group * kPanelBytes;
      if (kFold == Fold::kVd && folded)
        stage_o(staging, at.o_lanes, [&](int j, int e) {
          return gates.scaled_decay(Tiles::acc_col(j, e), p.scale) * o[4 * j + e];
        });
      else if constexpr (Gates::kScaledDecay)  // o's columns have their whole factor
        stage_o(staging, at.o_lanes, [&](int j, int e) { return o[4 * j + e]; });
      else
        stage_o(staging, at.o_lanes, [&](int j, int e) { return p.scale * o[4 * j + e]; });
    }
    store_checkpoint(p, item, c, rows, h, col0, st);
    if constexpr (kWithO) Aux::group_sync(2 + group);  // o[c % 2] written, and chunk c-1's copy of o[(c-1) % 2] done
    timeline_mark(p, 1, c, 5);
  }

  // After a state group's last chunk: that chunk's o, and the final state.
  template <bool kWithO>
  static __device__ __forceinline__ void finish_item(const ForwardParams& p, const WorkItem& item,
                                                     unsigned char (*o)[kTokenTileBytes], int64_t num_chunks, int h,
                                                     int group, const StateAcc& st) {
    if (kWithO && num_chunks > 0) {  // the last chunk's o
      const int64_t last = num_chunks - 1, left = item.eos - (item.bos + last * kChunk);
      copy_o(p, o[last & 1] + group * kPanelBytes, o_rows(p, item, h, group) + last * kChunk * p.o_strides.token,
             o_lanes(), left < kChunk ? static_cast<int>(left) : kChunk);
    }
    // The work item again (pure): not kept in registers across the loop.
    if (const StateBlock final = block_work_item(p).final; final.base != nullptr)
      store_state(final, 64 * group, st);
    timeline_mark(p, 1, 0, 11);
  }

  // QS^T [64,64] = S^T [64,128] @ Q^T [128,64] into o, issued (the caller commits): S^T's A fragments
  // against the slot's Q panel, from its pinned descriptor q0 (k-step 0) advanced by k-steps: one add a wgmma.
  static __device__ __forceinline__ void issue_qs(Acc& o, const Fragments (&st_frag)[8], uint64_t q0) {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
      wg::mma_rs<Elem, 64, Major::kK>(o, st_frag[ks], wg::k_step<Major::kK>(q0, 16 * ks, kChunk), ks > 0);
  }

  // A state group's start of an item (v4, v5): S^T from the initial state, and as A fragments (the
  // initial state loaded before the wait under the early start).
  static __device__ __forceinline__ void start_item(const ForwardParams& p, const WorkItem& item, int group,
                                                    StateAcc& st, Fragments (&st_frag)[8]) {
    timeline_mark(p, 1, 0, 10);
    load_initial_state(item, 64 * group, st);
    timeline_mark(p, 1, 1, 11);
    if (fused_forward_starts_early(p)) wait_for_previous_grid();
    wg::to_fragments<Elem, 8>(st, st_frag);
  }

  // The backward's chunk-state pass writes no o, so a state group's o staging (o[group], 16 KiB)
  // holds S^T entering chunk c on its way to chunk_states[chunk id][h] (rows v = 64 group ..; the
  // backward's dS pass stages dS^T the same way): stage_state puts the state's fragments there by
  // stmatrix (two 128B-swizzled panels, key columns 64 p ..; k-step ks is column block 2 (ks % 4) of
  // panel ks / 4), the layout of a TMA box of 64 rows x 64 columns, so that one thread of the group
  // (kStagingStorer) stores the two panels by TMA under the chunk's wgmmas.
  static __device__ __forceinline__ void stage_state(unsigned char* staging, const Fragments (&frag)[8]) {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
      stmatrix_x4(Tiles::fragment_rows(staging + (ks / 4) * kPanelBytes, 0, 2 * (ks % 4)), frag[ks]);
  }
  // The thread of a state group that stores its staged S^T (the dS pass's: warp 1's lane 0, whose SM
  // sub-partition holds the aux group's lightest warp; warp 0's holds the aux's TMA issue)
  static constexpr int kStagingStorer = 32;

  // The backward's pre-pass (ForwardParams::final_grad): <dS_T, S> over this group's rows of S^T
  // entering a sequence's last chunk, in fp32, as the group's 4 warps' partials of the chunk's 8.
  static __device__ void store_final_grad_dot(const ForwardParams& p, const WorkItem& item, int64_t chunk_id, int h,
                                              int group, const StateAcc& st) {
    const StateBlock grad = user_state(p.final_grad, p.final_grad_strides, p.state_vk, item.sequence, h);
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dot += st[4 * j + e] * grad.load(Tiles::acc_col(j, e), 64 * group + Tiles::acc_row(e));
    dot = warp_sum(dot);
    if (threadIdx.x % 32 == 0)
      p.final_grad_dots[(chunk_id * p.num_v_heads + h) * 8 + 4 * group + (threadIdx.x / 32) % 4] = dot;
  }

  // Chunk c's slot (c % 2) once the aux group has made it ready.
  static __device__ __forceinline__ int wait_ready(const ForwardParams& p, uint64_t (&ready)[2], int64_t c) {
    const int buf = static_cast<int>(c & 1);
    timeline_mark(p, 1, c, 0);
    tma::wait(&ready[buf], static_cast<uint32_t>((c >> 1) & 1));
    timeline_mark(p, 1, c, 1);
    return buf;
  }

  // kWithO: the main pass (o written); without, the CP state pass (no Q: no QS, P Vd, o).
  // kExactUpdate (without o): the state update's operand as hi + lo.
  template <bool kWithO, bool kExactUpdate = false>
  static __device__ __forceinline__ void run_state(const ForwardParams& p, const ForwardTileMaps& maps,
                                                   SharedStorage& s, int h, int group) {
    const WorkItem item = block_work_item(p);  // pure: recomputed per role
    // 32-bit chunk steps (aux_loop's): the item's last chunk, the one that may be partial, has
    // last_rows rows; per chunk one compare, no 64-bit row math
    const int num_chunks = static_cast<int>((item.eos - item.bos + kChunk - 1) / kChunk);
    const int last_rows = static_cast<int>(item.eos - item.bos - static_cast<int64_t>(num_chunks - 1) * kChunk);
    StateAcc st;
    Fragments st_frag[8];
    start_item(p, item, group, st, st_frag);

    const bool save_states = !kWithO && p.chunk_states != nullptr;
    // The chunk whose entering state gives <dS_T, S> (a sequence's last), -1 if none
    const int grad_dot_step = item.sequence_end && p.final_grad_dots != nullptr ? num_chunks - 1 : -1;
    // S^T entering chunk c goes to maps.states' rows states_row .. (its [Hv][128] block of chunk_states,
    // the group's 64 rows), one block on a chunk
    const bool storer = threadIdx.x % 128 == kStagingStorer;
    if (save_states && storer) tma::prefetch_map(&maps.states);
    int states_row = static_cast<int>((item.first_chunk_id * p.num_v_heads + h) * kHeadDim) + 64 * group;
    const int states_step = p.num_v_heads * kHeadDim;
    // o_rows of chunk c - 1 (ChunkEnd::o_rows) at chunk c
    const int64_t chunk_rows = kChunk * p.o_strides.token;
    int64_t out_rows = kWithO ? o_rows(p, item, h, group) - chunk_rows : 0;
    const uint32_t out_lanes = kWithO ? o_lanes() : 0;
    // Slot 0's shared address / 16 (the dS pass's descriptor words): slot buf's tile t lies at this
    // + buf sizeof(Slot) / 16 + offsetof(t) / 16, constants but for buf, so a product's descriptor is
    // one add to it, not the tile address's masking chain per product and chunk
    const uint32_t slot0_word = static_cast<uint32_t>(wg::encode(smem_addr(&s.slot[0])));
#pragma unroll 1
    for (int c = 0; c < num_chunks; ++c) {
      if (save_states) {
        // chunk c-1's stores have read the staging (the wait a no-op but in the storer, and at c = 0:
        // no branches)
        tma::wait_bulk_read<0>();
        Aux::group_sync(2 + group);
        stage_state(s.o[group], st_frag);
        wg::fence_shared_to_async();  // the stmatrix, for the stores
        if (c == grad_dot_step) store_final_grad_dot(p, item, item.first_chunk_id + c, h, group, st);
      }
      const int buf = wait_ready(p, s.ready, c);
      const uint32_t slot_word = slot0_word + static_cast<uint32_t>(buf) * (sizeof(Slot) >> 4);
      // a tile's descriptor at k-step 0, pinned (its k-steps: one add each); offset: its bytes into the slot
      const auto pinned = [&](auto major, uint32_t offset) {
        return wg::pinned_descriptor_from_word<decltype(major)::value>(slot_word + offset / 16, kChunk);
      };
      using KMajor = std::integral_constant<Major, Major::kK>;
      using MnMajor = std::integral_constant<Major, Major::kMN>;

      // Vd^T = V^T Ag^T + S^T (-W~)^T; QS^T = S^T Q^T.
      Acc vd, o;
      wg::fence();
      {
        const uint64_t v0 = pinned(MnMajor{}, offsetof(Slot, v) + group * kPanelBytes);
        const uint64_t ag0 = pinned(KMajor{}, offsetof(Slot, ag));
#pragma unroll
        for (int k0 = 0; k0 < kChunk; k0 += 16)
          wg::mma_ss<Elem, 64, Major::kMN, Major::kK>(vd, wg::k_step<Major::kMN>(v0, k0, kChunk),
                                                      wg::k_step<Major::kK>(ag0, k0, kChunk), k0 > 0);
        const uint64_t w0 = pinned(KMajor{}, offsetof(Slot, w_neg));
#pragma unroll
        for (int ks = 0; ks < 8; ++ks)
          wg::mma_rs<Elem, 64, Major::kK>(vd, st_frag[ks], wg::k_step<Major::kK>(w0, 16 * ks, kChunk), true);
      }
      if constexpr (kWithO) issue_qs(o, st_frag, pinned(KMajor{}, offsetof(Slot, q)));
      wg::commit();
      if (save_states) {
        Aux::group_sync(2 + group);  // the group's stmatrix, before the stores (here: under the wgmmas)
        if (storer) {
          tma::store_2d(&maps.states, s.o[group], 0, states_row);
          tma::store_2d(&maps.states, s.o[group] + kPanelBytes, 64, states_row);
          tma::commit_bulk();
        }
        states_row += states_step;
      }
      wg::wait<0>();
      wg::fence_operand(vd);
      wg::fence_operand(o);
      timeline_mark(p, 1, c, 2);

      const ChunkEnd at{slot_word + static_cast<uint32_t>(offsetof(Slot, k) / 16),
                        slot_word + static_cast<uint32_t>(offsetof(Slot, p) / 16), s.o, &s.free[buf], out_rows,
                        out_lanes};
      const GatesFromTables gates{s.gcum[buf], s.o_scale[buf], s.rho[buf], s.fold[buf]};
      finish_chunk<kWithO, kExactUpdate>(p, item, at, gates, c, c == num_chunks - 1 ? last_rows : kChunk, h, group, st,
                                         st_frag, vd, o, [] {}, kWithO && folds_gates(s.gcum[buf]));
      if constexpr (kWithO) out_rows += chunk_rows;
    }
    finish_item<kWithO>(p, item, s.o, num_chunks, h, group, st);
    if (save_states && storer) tma::wait_bulk_read<0>();  // shared memory stays until the last store has read it
  }

  // The entry of v4 (Kernel = FusedForwardRs) and v5 (FusedForwardInv): Kernel's roles over its
  // shared storage. kExactUpdate (v4, the backward's pre-pass: never o): the state groups' hi + lo
  // update, in a kernel of its own so that the forward's keeps its code.
  template <typename Kernel, bool kExactUpdate = false>
  static __device__ __forceinline__ void run_kernel(const ForwardParams& p, const ForwardTileMaps& maps) {
    extern __shared__ __align__(1024) unsigned char smem_fused[];
    auto& s = *reinterpret_cast<typename Kernel::SharedStorage*>(smem_fused);
    constexpr bool kBlockItem = std::is_same_v<Kernel, FusedForwardRs>;  // v4 (run_roles: registers)
    run_roles<Kernel::kAuxRegisters, Kernel::kStateRegisters, kBlockItem>(
        p, s, [&](bool with_o, int hk, int h) { Kernel::run_aux(p, maps, s, with_o, hk, h); },
        [&](bool with_o, int h, int group) {
          if constexpr (kExactUpdate)
            Kernel::template run_state<false, true>(p, maps, s, h, group);
          else if (with_o)
            Kernel::template run_state<true>(p, maps, s, h, group);
          else
            Kernel::template run_state<false>(p, maps, s, h, group);
        });
  }
  template <bool kExactUpdate>
  static __device__ void run(const ForwardParams& p, const ForwardTileMaps& maps) {
    run_kernel<FusedForwardRs, kExactUpdate>(p, maps);
  }
};

// kExactUpdate: the backward's pre-pass with a final-state gradient (ForwardParams::exact_state_update).
template <typename Elem, typename InverseT, bool kExactUpdate>
__global__ void __launch_bounds__(384, 1) fused_forward_rs_kernel(const __grid_constant__ ForwardParams p,
                                                                  const __grid_constant__ ForwardTileMaps maps) {
  // Without CP the wait comes later, in each role (fused_forward_starts_early).
  if (!fused_forward_starts_early(p)) wait_for_previous_grid();
  release_next_grid();
  FusedForwardRs<Elem, InverseT>::template run<kExactUpdate>(p, maps);
}

}  // namespace flashgdn::kern
