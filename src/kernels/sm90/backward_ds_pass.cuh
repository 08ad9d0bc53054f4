// The backward's dS pass (sm_90a), v4-shaped: the reverse recurrence of the state gradient alone,
// dS (= D, [K, V]) in fp32 registers as D^T across two state warpgroups, fed by an aux warpgroup on
// v4's TMA ring (fused_forward_rs.cuh: aux_loop with the chunks last to first). Its items
// (backward_item below):
//   CP dS* pass (fwd.cp_pass == kCpStatePass): each segment's leading decay window from dS = 0 to
//     segment_grad_starts;
//   main mode (kNoCp: sequences from dht; kCpMainPass: segments from their corrected ends), for the
//     gradient pass (backward_grads.cuh): dS^T leaving every chunk into bp.chunk_grad_states (v4's
//     staging: stmatrix into the group's free o staging at the chunk's top, two TMA stores under
//     its first wgmmas), dh0 from the first chunk of a sequence. (dgamma's <dS, S> is the gradient
//     pass's, from its bf16 S^T and dS^T tiles: reading S^T here was a quarter of this pass's bytes,
//     and the dS rounding moves dg by under 1% of its error, bench/precision_study pre+dot16.)
//
// Math (the per-chunk dS terms of src/reference/backward_chunked.cpp, transposed; s = scale,
// Gamma = diag(e^g), rho = e^{gamma - g}, P = G (.) Q K^T lower with the diagonal, Ag = G (.) A_r (.) 1 beta^T):
//   dVd^T [64v, 64t] = D^T (rho K)^T + s dO^T P                 (dVd = rho (.) (K D) + (sP)^T dO)
//   dU^T  [64v, 64t] = dVd^T (-Ag Gamma)                          (dU = -Gamma Ag^T dVd)
//   D^T'  [64v,128k] = e^gamma D^T + dU^T K + dO^T (s Gamma Q)   (D' = e^gamma D + K^T dU + Q^T s Gamma dO)
// Every factor is at most 1 (gcum falls within a chunk), so no scaling overflows. fp16 (gate_shift): q
// and ag carry 2^shift Gamma, shift = floor(-gcum[0]) (the chunk's first factor in (1/2, 1]: still at
// most 1), so the terms D^T gets from them are 2^shift too large: D^T *= 2^shift e^gamma before, 2^-shift
// after the chunk's wgmmas (else q, ag and dU, gated by ~e^-11 a token under strong decay, fall into
// fp16's subnormals and dh0 loses its digits).
//
// Grid (N sequences or max segments, Hv), or (1, Hv, N) with the sequence order (the sequences longest
// first, sequence.cuh heads_fastest); block 384 threads = 3 warpgroups, v4's shared memory (193 KiB) and ring.
//   aux   (warpgroup 0; v4's register budget): aux_loop<kLoadAg, kReverse> with dO in V's boxes
//         (the launcher's tensor maps) and Ag from the gated copy of the backward's chunk inverse
//         (fwd.gated_inverse_out), gate records from fwd.chunk_gates. Per chunk, in the slot (row and
//         column factors from a table the group writes first, OperandFactors):
//           w_neg = rho K                   (16-byte units of K, row-scaled)
//           p     = s P                     (SS wgmma, product_p: a folded chunk's (Rs::folds_gates)
//                                            as diag(s e^{g - gamma}) Q (rho K)^T)
//           q     = s Gamma Q               (in place, after P's wgmmas are done)
//           ag    = -Ag Gamma               (in place, column-scaled)
//   state (warpgroups 1, 2 = groups g 0, 1; v4's register budget): rows v = 64 g .. of D^T as one
//         m64n128 accumulator and its Elem A fragments. Per chunk after ready[c % 2]:
//           dVd^T = D^T @ (rho K)^T (RS, 8 x m64n64k16, w_neg K-major) + dO^T @ sP (SS, 4; dO's panel g
//                   as M-major A, p as N-major B)                                 -> A fragments
//           dU^T  = dVd^T @ (-Ag Gamma) (RS, 4; ag N-major)                        -> A fragments
//           D^T  *= e^gamma;  D^T += dU^T @ K (RS, 4 x m64n128k16) + dO^T @ (s Gamma Q) (SS, 4)
//           free[c % 2]; D^T -> A fragments
//         After the item: D^T -> ds_start (fp32, the StateBlock's layout).
//         Named barriers 2 + g (state group g): the staging's write / store order.
#pragma once

#include "kernels/sm90/fused_forward_rs.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/tensor_map.h"

namespace flashgdn::kern {

// What one CTA of the dS pass does. Without CP, x is a sequence: all its chunks from dht to dh0.
// With CP, x is a segment j of sequence n:
//   dS* pass (fwd.cp_pass == kCpStatePass), j >= 1 (every j with p.shard): the segment's leading
//     decay window (the whole segment without one) from dS = 0 -> segment_grad_starts[x]
//   main pass: the segment from dS_{j+1} (dht for the last segment, else segment_grad_ends[x]);
//     dS^T leaving each of its chunks; dh0 from the first segment
struct BackwardItem {
  bool valid = false;
  int64_t batch = 0, bos = 0, eos = 0;
  int64_t first_chunk_id = 0;  // global chunk id of the chunk starting at bos (chunk_states row)
  StateBlock ds_end;           // gradient w.r.t. the state leaving the tokens; null: zero
  StateBlock ds_start;         // where the gradient w.r.t. the entering state goes; null: nowhere
};

__device__ __forceinline__ BackwardItem backward_item(const BackwardParams& bp, int64_t x, int h) {
  const ForwardParams& p = bp.fwd;
  BackwardItem item;
  if (p.cp_pass == kNoCp) {
    const SequenceBounds seq = sequence_bounds(p, x);
    item.valid = true;
    item.batch = seq.batch;
    item.bos = seq.bos;
    item.eos = seq.eos;
    item.first_chunk_id = seq.eos > seq.bos ? first_chunk(p, x) : 0;
    item.ds_end = user_state(bp.d_final_state, bp.d_final_state_strides, p.state_vk, x, h);
    item.ds_start = user_state(bp.d_initial_state, bp.d_initial_state_strides, p.state_vk, x, h);
    return item;
  }
  const SegmentLocation at = locate_segment(p, x);
  if (!at.valid) return item;
  item.batch = at.seq.batch;
  item.bos = at.bos;
  if (p.cp_pass == kCpStatePass) {
    if (at.index == 0 && !p.shard) return item;  // a shard's first segment feeds its grad map D
    const int32_t window = p.grad_window_chunks[x * p.num_v_heads + h];
    const int64_t window_end = at.bos + static_cast<int64_t>(window) * kChunk;
    item.eos = window != 0 && window_end < at.eos ? window_end : at.eos;
    item.ds_start = segment_state(bp.segment_grad_starts, p.num_v_heads, x, h);
  } else {
    item.eos = at.eos;
    item.ds_end = at.last() ? user_state(bp.d_final_state, bp.d_final_state_strides, p.state_vk, at.sequence, h)
                            : segment_state(bp.segment_grad_ends, p.num_v_heads, x, h);
    if (at.index == 0)
      item.ds_start = user_state(bp.d_initial_state, bp.d_initial_state_strides, p.state_vk, at.sequence, h);
  }
  item.valid = true;
  item.first_chunk_id = first_chunk(p, at.sequence) + (item.bos - at.seq.bos) / kChunk;
  return item;
}

template <typename Elem>
struct BackwardDsPass {
  using Rs = FusedForwardRs<Elem, __nv_bfloat16>;  // ring, roles' register budgets, state helpers
  using Aux = typename Rs::Aux;
  using Tiles = typename Rs::Tiles;
  using Slot = typename Rs::Slot;
  // A chunk's operand factors as PackedFactor words (packed_factor), written once by the aux group
  // (write_operand_factors: one thread a token or four columns) for all its threads, which need each
  // row's eight times and each column pair's sixteen times (chunk_operands).
  struct OperandFactors {
    uint4 rows[kChunk];               // token t: {hi, lo} of rho_t, then of s e^{g_t} (both halves the factor)
    uint4 ag_columns[kChunk / 4];     // columns 4 u .. 4 u + 3: {hi, lo} of (-e^{g_4u}, -e^{g_4u+1}), of the next pair
  };
  // v4's storage and the aux group's operand factors, per slot
  struct SharedStorage : Rs::SharedStorage {
    OperandFactors factors[2];
  };
  // The thread of a state group that stores its staged dS^T (warp 1's lane 0: its SM sub-partition
  // holds the aux group's lightest warp, warp 0's holds the aux's TMA issue)
  static constexpr int kStagingStorer = 32;
  using Acc = typename Rs::Acc;
  using StateAcc = typename Rs::StateAcc;
  using Fragments = typename Rs::Fragments;
  using Major = wg::Major;
  static constexpr int kThreads = Rs::kThreads;
  static constexpr int kPanelBytes = Rs::kPanelBytes;

  // The ring's item: the backward item's tokens (the aux group's boxes and gate records).
  static __device__ __forceinline__ WorkItem ring_item(const BackwardItem& item) {
    WorkItem ring;
    ring.valid = item.valid;
    ring.batch = item.batch;
    ring.bos = item.bos;
    ring.eos = item.eos;
    ring.first_chunk_id = item.first_chunk_id;
    return ring;
  }

  // A factor as a pair of Elem pairs (hi, lo: factor ~ hi + lo to ~2^-17) for scale_unit.
  struct PackedFactor {
    uint32_t hi, lo;
  };
  static __device__ __forceinline__ PackedFactor packed_factor(float f0, float f1) {
    // each half from its own scalar rounding (no unpacking of the packed pair: ptxas then reads
    // the halves by operand selectors)
    const Elem h0 = Elem(f0), h1 = Elem(f1);
    const Elem l0 = Elem(f0 - static_cast<float>(h0)), l1 = Elem(f1 - static_cast<float>(h1));
    PackedFactor f;
    f.hi = static_cast<uint32_t>(elem_bits(h0)) | static_cast<uint32_t>(elem_bits(h1)) << 16;
    f.lo = static_cast<uint32_t>(elem_bits(l0)) | static_cast<uint32_t>(elem_bits(l1)) << 16;
    return f;
  }
  static __device__ __forceinline__ unsigned short elem_bits(Elem x) {
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) return __bfloat16_as_ushort(x);
    else return __half_as_ushort(x);
  }
  // x (.) f for an Elem pair: x lo rounded, then fma(x, hi, that) rounded once (so the product is
  // x f to ~2^-16 before its one rounding, as the fp32 product's)
  static __device__ __forceinline__ uint32_t scale_pair(uint32_t x, PackedFactor f) {
    using Pair = std::conditional_t<std::is_same_v<Elem, __nv_bfloat16>, __nv_bfloat162, __half2>;
    const Pair xv = *reinterpret_cast<const Pair*>(&x), hi = *reinterpret_cast<const Pair*>(&f.hi),
               lo = *reinterpret_cast<const Pair*>(&f.lo);
    const Pair out = __hfma2(hi, xv, __hmul2(lo, xv));
    return *reinterpret_cast<const uint32_t*>(&out);
  }
  // Elem x 8 of a 16-byte unit times factor pairs (f[w] for word w), from `from` to `to` (in place if equal).
  static __device__ __forceinline__ void scale_unit(const unsigned char* from, unsigned char* to,
                                                    const PackedFactor (&f)[4]) {
    uint4 unit = *reinterpret_cast<const uint4*>(from);
    uint32_t* words = reinterpret_cast<uint32_t*>(&unit);
#pragma unroll
    for (int w = 0; w < 4; ++w) words[w] = scale_pair(words[w], f[w]);
    *reinterpret_cast<uint4*>(to) = unit;
  }
  // fp16's shift of a chunk's gate factors (log2 units): under strong decay the factors e^{g_t} of
  // q = s Gamma Q and ag = -Ag Gamma, and with them dU = dVd^T (-Ag Gamma), are below fp16's smallest
  // normal (6.1e-5; e^{g_0} ~ e^-11 a token under real-model gates with A = 16) and keep a few bits:
  // dh0, which then comes from the chunk's first tokens through exactly these products, lost up to 5%
  // (bench/dh0_fp16_emulation.py). So q and ag carry 2^shift e^{g_t}, shift = floor(-gcum[0]) (at most
  // 126: 2^-shift stays a normal fp32), putting the chunk's first factor in (1/2, 1]; their products
  // (dU^T K, dO^T q) come out 2^shift too large, and D^T, pre-multiplied by 2^shift e^gamma (<= 1 as
  // before) instead of e^gamma, sums with them and is multiplied by 2^-shift after: powers of two,
  // exact in fp32. bf16 has fp32's exponent range: shift 0, its code unchanged. "Factors at most 1"
  // rests on the gates' contract g <= 0 (problem.h: log-decays, gcum falling within a chunk), which no
  // kernel checks: a positive gate after a very negative first one would lift a shifted factor above 1
  // and could overflow fp16 where the unshifted one would only have lost digits.
  static __device__ __forceinline__ float gate_shift(float g0) {
    if constexpr (std::is_same_v<Elem, __half>) return fmaxf(0.f, fminf(floorf(-g0), 126.f));
    else return 0.f;
  }
  // g + shift (exact: an integer no larger than -g_0 >= -g); bf16's g itself, no add
  static __device__ __forceinline__ float shifted(float g, float shift) {
    if constexpr (std::is_same_v<Elem, __half>) return g + shift;
    else return g;
  }

  // Thread i < 64 of the aux group, counted from warp 1: token i's factors; 64 <= i < 80: Ag's columns
  // 4 (i - 64) .. + 3. Warp 0 writes none: its thread 0 issues each chunk's loads (aux_loop), the
  // longest of the group's per-chunk paths; warps 1 and 2 store the fewest of P's blocks after warp 0.
  // Read after a group barrier.
  static __device__ __forceinline__ void write_operand_factors(OperandFactors& f, const float* gcum, float scale) {
    const int i = (threadIdx.x + 96) % 128;
    const float shift = gate_shift(gcum[0]);  // 2^shift on the e^{g_t} of q and ag (fp16; 0 for bf16)
    if (i < kChunk) {
      const float g = gcum[i];
      const float k_factor = exp2_approx(gcum[kChunk - 1] - g), q_factor = scale * exp2_approx(shifted(g, shift));
      const PackedFactor k = packed_factor(k_factor, k_factor), q = packed_factor(q_factor, q_factor);
      f.rows[i] = make_uint4(k.hi, k.lo, q.hi, q.lo);
    } else if (i < kChunk + kChunk / 4) {
      const float4 g = *reinterpret_cast<const float4*>(gcum + 4 * (i - kChunk));
      const PackedFactor a = packed_factor(-exp2_approx(shifted(g.x, shift)), -exp2_approx(shifted(g.y, shift))),
                         b = packed_factor(-exp2_approx(shifted(g.z, shift)), -exp2_approx(shifted(g.w, shift)));
      f.ag_columns[i - kChunk] = make_uint4(a.hi, a.lo, b.hi, b.lo);
    }
  }

  // The halves of a token's OperandFactors::rows word: {x, y} rho's, {z, w} s e^g's.
  static constexpr int kRhoHalf = 0, kQHalf = 1;
  // A [64 tokens][128] tile's two panels from `from` to `to` (in place if equal), row t scaled by token
  // t's factor (half kHalf of factors.rows[t]). Its factors depend on the row only, so the 16-byte
  // units are walked in storage order (a 128B swizzle permutes units within a row): unit tid + 128 i of
  // a panel is row tid / 8 + 16 i (i < 4).
  template <int kHalf>
  static __device__ __forceinline__ void scale_token_rows(const OperandFactors& factors, const unsigned char* from,
                                                          unsigned char* to) {
    const int tid = threadIdx.x % 128;
#pragma unroll
    for (int i = 0; i < kPanelBytes / 16 / 128; ++i) {
      const uint4 row = factors.rows[tid / 8 + 16 * i];
      const PackedFactor f = kHalf == kRhoHalf ? PackedFactor{row.x, row.y} : PackedFactor{row.z, row.w},
                         words[4] = {f, f, f, f};
#pragma unroll
      for (int panel = 0; panel < 2; ++panel) {
        const uint32_t at = panel * kPanelBytes + 16 * (tid + 128 * i);
        scale_unit(from + at, to + at, words);
      }
    }
  }

  // P's blocks above its diagonal blocks (warp w's rows 16 w .., column blocks j > 2 w + 1) are zero in
  // every chunk: set once in both slots before the ring (product_p leaves them), 16-byte stores.
  static __device__ __forceinline__ void zero_upper_p(SharedStorage& s) {
    const int tid = threadIdx.x % 128;
#pragma unroll
    for (int buf = 0; buf < 2; ++buf)
#pragma unroll
      for (int i = 0; i < Tiles::kSquareTileBytes / 16 / 128; ++i)
        *reinterpret_cast<uint4*>(s.slot[buf].p + 16 * (tid + 128 * i)) = make_uint4(0, 0, 0, 0);
  }

  // P = s G (.) Q K^T [64,64] into slot.p, lower with the diagonal, from the SS wgmma of Q and kb (K, or
  // w_neg = rho K) and element(j, e, x) of the product's element 4 j + e = x. Warp w's rows 16 w ..
  // 16 w + 15 against column block j: all below the diagonal for j < 2 w, all above for j > 2 w + 1, so
  // only blocks 2 w and 2 w + 1 compare (resolved per warp at compile time, a warp-uniform switch), and
  // blocks j > 2 w + 1 stay as zero_upper_p left them: stmatrix of blocks j <= 2 w + 1 only. In those
  // two, element e's row 16 w + lane / 4 + 8 (e / 2) against column 16 w + 8 (j - 2 w) + 2 (lane % 4) +
  // e % 2: block 2 w's rows + 8 (e >= 2) all below, block 2 w + 1's first rows (e < 2) all above, and
  // the rest below iff lane / 4 >= 2 (lane % 4) + e % 2 (two compares a thread).
  template <typename Element>
  static __device__ __forceinline__ void product_p(Slot& slot, const unsigned char* kb, Element&& element) {
    Acc qk;
    wg::fence();
    wg::mma_ss_k<Elem, 64, Major::kK, Major::kK, kHeadDim, true>(qk, slot.q, kChunk, kb, kChunk, false);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(qk);
    const int lane = threadIdx.x % 32;
    const bool lane_below[2] = {lane / 4 >= 2 * (lane % 4), lane / 4 >= 2 * (lane % 4) + 1};
    const auto store = [&](auto warp) {
      constexpr int kWarp = decltype(warp)::value;
#pragma unroll
      for (int j = 0; j <= 2 * kWarp; j += 2) {
        uint32_t regs[4];
        Tiles::pack_x4(regs, j, [&](int jj, int e) {
          if (jj == 2 * kWarp + 1 && e < 2) return 0.f;
          const float x = element(jj, e, qk[4 * jj + e]);
          return jj < 2 * kWarp || (jj == 2 * kWarp && e >= 2) || lane_below[e % 2] ? x : 0.f;
        });
        stmatrix_x4(Tiles::fragment_rows(slot.p, 0, j), regs);
      }
    };
    switch ((threadIdx.x / 32) % 4) {
      case 0: store(std::integral_constant<int, 0>{}); break;
      case 1: store(std::integral_constant<int, 1>{}); break;
      case 2: store(std::integral_constant<int, 2>{}); break;
      default: store(std::integral_constant<int, 3>{}); break;
    }
  }

  // The aux group's operands of one chunk in its slot (gcum: the chunk's gates, log2 units; factors:
  // the chunk's, written here). The K and Q tiles' factors depend on the row (token) only
  // (scale_token_rows); Ag's depend on the column: unit u of row r holds columns 8 (u ^ (r % 8)) ...
  static __device__ __forceinline__ void chunk_operands(Slot& slot, const float* gcum, OperandFactors& factors,
                                                        float scale) {
    const int r = Tiles::acc_row(0), tid = threadIdx.x % 128;
    write_operand_factors(factors, gcum, scale);
    Aux::group_sync(Aux::kAuxBarrier);  // the factors written
    scale_token_rows<kRhoHalf>(factors, slot.k, slot.w_neg);  // w_neg = rho K (before P: a folded chunk's P reads it)
    const float gamma = gcum[kChunk - 1];
    if (Rs::folds_gates(gcum)) {
      // A folded chunk (bf16, decay -gamma at most 64 in log2 units): s e^{g_i - g_t} = s e^{g_i - gamma}
      // rho_t, so P = diag(s e^{g - gamma}) (Q (rho K)^T), one multiply an element by the row's factor
      // (<= s 2^64) instead of an exponent each; its K operand is w_neg (rho >= 2^-64: no underflow).
      wg::fence_shared_to_async();  // w_neg, for P's wgmmas
      Aux::group_sync(Aux::kAuxBarrier);
      const float row_factor[2] = {scale * exp2_approx(gcum[r] - gamma), scale * exp2_approx(gcum[r + 8] - gamma)};
      product_p(slot, slot.w_neg, [&](int, int e, float x) { return row_factor[e / 2] * x; });
    } else {
      float log2_scale;  // s 2^x = 2^(x + log2 s): P's scale inside its exponent
      asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(log2_scale) : "f"(scale));
      const float g_rows[2] = {gcum[r] + log2_scale, gcum[r + 8] + log2_scale};
      float g_col[16];
      Aux::column_values(gcum, g_col);
      product_p(slot, slot.k, [&](int j, int e, float x) {
        return exp2_approx(g_rows[e / 2] - g_col[2 * j + e % 2]) * x;
      });
    }
    scale_token_rows<kQHalf>(factors, slot.q, slot.q);  // q = s Gamma Q in place (P's wgmmas are done)
    // Ag: unit tid + 128 i is row tid / 8 + 16 i, unit tid % 8, so columns 8 ((tid % 8) ^ ((tid / 8) % 8)) ..
    // for every i: eight column factors a chunk
    const int col_unit = (tid % 8) ^ ((tid / 8) % 8);
    const uint4 pairs01 = factors.ag_columns[2 * col_unit], pairs23 = factors.ag_columns[2 * col_unit + 1];
    const PackedFactor neg_decay[4] = {{pairs01.x, pairs01.y}, {pairs01.z, pairs01.w}, {pairs23.x, pairs23.y},
                                       {pairs23.z, pairs23.w}};
#pragma unroll
    for (int i = 0; i < kPanelBytes / 16 / 128; ++i) {
      const uint32_t at = 16 * (tid + 128 * i);
      scale_unit(slot.ag + at, slot.ag + at, neg_decay);
    }
  }

  // grad_map: bp.chunk_grad_states as [chunk, hv, 128 rows] x 128, boxes of 64 rows x 64 columns (one
  // staging panel), where save_states.
  static __device__ __forceinline__ void run_state(const BackwardParams& bp, const BackwardItem& item,
                                                   const CUtensorMap& grad_map, SharedStorage& s, int h, int group) {
    const ForwardParams& p = bp.fwd;
    const int num_chunks = static_cast<int>((item.eos - item.bos + kChunk - 1) / kChunk);  // int steps (fewer per chunk)
    const int col0 = 64 * group;
    StateAcc dt;
    if (item.ds_end.base != nullptr) {
      Rs::template load_stored_state<float>(item.ds_end, col0, dt);
    } else {
#pragma unroll
      for (int x = 0; x < 64; ++x) dt[x] = 0.f;
    }
    Fragments dt_frag[8];
    wg::to_fragments<Elem, 8>(dt, dt_frag);
    const bool save_states = bp.chunk_grad_states != nullptr;

    const int64_t last_chunk_id = item.first_chunk_id + num_chunks - 1;
    // Slot 0's shared address / 16 (descriptor words: slot buf's tile t is this + buf sizeof(Slot) / 16
    // + offsetof(t) / 16, constants but for buf)
    const uint32_t slot0_word = (smem_addr(&s.slot[0]) & 0x3FFFF) >> 4;
    // dS^T leaving chunk chunk_id goes to grad_map's rows grad_row .., one [hv][128] block back a chunk
    const bool storer = threadIdx.x % 128 == kStagingStorer;
    if (save_states && storer) tma::prefetch_map(&grad_map);
    int grad_row = static_cast<int>((last_chunk_id * p.num_v_heads + h) * kHeadDim) + 64 * group;
    const int grad_step = p.num_v_heads * kHeadDim;
    int buf = 0;          // chunk c's slot, c % 2
    uint32_t parity = 0;  // its ready barrier's phase parity, (c / 2) % 2
#pragma unroll 1
    for (int c = 0; c < num_chunks; ++c) {
      if (save_states) {  // dS^T leaving the chunk (chunk id last_chunk_id - c)
        // the last chunk's stores have read the staging (the wait a no-op but in the storer, and at c = 0:
        // no branches)
        tma::wait_bulk_read<0>();
        Aux::group_sync(2 + group);
        Rs::stage_state(s.o[group], dt_frag);
        wg::fence_shared_to_async();  // the stmatrix, for the stores
      }
      tma::wait(&s.ready[buf], parity);
      const uint32_t slot_word = slot0_word + static_cast<uint32_t>(buf) * (sizeof(Slot) >> 4);
      // The products' descriptors at k-step 0, pinned (their k-steps: one add each); dO's, which two
      // products read, unpinned from its word (ptxas forms its four k-steps once for both: pinned, each
      // k-step was a 64-bit add with carry, formed again for the second product).
      const auto pinned = [&](auto major, uint32_t offset) {
        return wg::pinned_descriptor_from_word<decltype(major)::value>(slot_word + offset / 16, kChunk);
      };
      using KMajor = std::integral_constant<Major, Major::kK>;
      using MnMajor = std::integral_constant<Major, Major::kMN>;
      const uint32_t d_o_word = slot_word + (offsetof(Slot, v) + group * kPanelBytes) / 16;

      // dVd^T = D^T (rho K)^T + dO^T (s P)
      Acc dvd;
      wg::fence();
      const uint64_t w_neg0 = pinned(KMajor{}, offsetof(Slot, w_neg)), p0 = pinned(MnMajor{}, offsetof(Slot, p));
#pragma unroll
      for (int ks = 0; ks < 8; ++ks)
        wg::mma_rs<Elem, 64, Major::kK>(dvd, dt_frag[ks], wg::k_step<Major::kK>(w_neg0, 16 * ks, kChunk), ks > 0);
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 64, Major::kMN, Major::kMN>(dvd, wg::descriptor_from_word<Major::kMN>(d_o_word, k0, kChunk),
                                                     wg::k_step<Major::kMN>(p0, k0, kChunk), true);
      wg::commit();
      if (save_states) {
        Aux::group_sync(2 + group);  // the group's stmatrix, before the stores (here: under the wgmmas)
        if (storer) {
          tma::store_2d(&grad_map, s.o[group], 0, grad_row);
          tma::store_2d(&grad_map, s.o[group] + kPanelBytes, 64, grad_row);
          tma::commit_bulk();
        }
        grad_row -= grad_step;
      }
      wg::wait<0>();
      wg::fence_operand(dvd);
      Fragments dvd_frag[4];
      wg::to_fragments<Elem, 4>(dvd, dvd_frag);

      // dU^T = dVd^T (-Ag Gamma)
      Acc du;
      wg::fence();
      const uint64_t ag0 = pinned(MnMajor{}, offsetof(Slot, ag));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma_rs<Elem, 64, Major::kMN>(du, dvd_frag[ks], wg::k_step<Major::kMN>(ag0, 16 * ks, kChunk), ks > 0);
      wg::commit();
      float shift = 0.f;  // fp16: gate_shift's 2^shift on q, ag (so on dU), and here on D^T
      {  // D^T *= e^gamma under dU's wgmmas (D^T is no operand of theirs); the volatile load keeps it after their issue
        float g;
        asm volatile("ld.volatile.shared.f32 %0, [%1];\n" : "=f"(g) : "r"(smem_addr(&s.gcum[buf][kChunk - 1])) : "memory");
        if constexpr (std::is_same_v<Elem, __half>) {
          float g0;
          asm volatile("ld.volatile.shared.f32 %0, [%1];\n" : "=f"(g0) : "r"(smem_addr(&s.gcum[buf][0])) : "memory");
          shift = gate_shift(g0);
        }
        const float decay = exp2_approx(shifted(g, shift));
#pragma unroll
        for (int x = 0; x < 64; ++x) dt[x] *= decay;
      }
      wg::wait<0>();
      wg::fence_operand(du);
      Fragments du_frag[4];
      wg::to_fragments<Elem, 4>(du, du_frag);

      // D^T = e^gamma D^T + dU^T K + dO^T (s Gamma Q)
      wg::fence();
      const uint64_t key0 = pinned(MnMajor{}, offsetof(Slot, k)), q0 = pinned(MnMajor{}, offsetof(Slot, q));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma_rs<Elem, 128, Major::kMN>(dt, du_frag[ks], wg::k_step<Major::kMN>(key0, 16 * ks, kChunk), true);
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16)
        wg::mma_ss<Elem, 128, Major::kMN, Major::kMN>(dt, wg::descriptor_from_word<Major::kMN>(d_o_word, k0, kChunk),
                                                      wg::k_step<Major::kMN>(q0, k0, kChunk), true);
      wg::commit();
      wg::wait<0>();
      wg::fence_operand(dt);
      tma::arrive(&s.free[buf]);  // every read of the slot is done
      if constexpr (std::is_same_v<Elem, __half>) {
        if (shift != 0.f) {  // D^T back from 2^shift (warp-uniform: no multiply under weak decay)
          const float unshift = __int_as_float((127 - static_cast<int>(shift)) << 23);
#pragma unroll
          for (int x = 0; x < 64; ++x) dt[x] *= unshift;
        }
      }
      wg::to_fragments<Elem, 8>(dt, dt_frag);
      parity ^= buf;
      buf ^= 1;
    }
    if (item.ds_start.base != nullptr) Rs::store_state(item.ds_start, col0, dt);
    if (save_states && storer) tma::wait_bulk_read<0>();  // shared memory stays until the last store has read it
  }

  static __device__ void run(const BackwardParams& bp, const ForwardTileMaps& maps, const CUtensorMap& grad_map) {
    extern __shared__ __align__(1024) unsigned char smem_ds[];
    auto& s = *reinterpret_cast<SharedStorage*>(smem_ds);
    const ForwardParams& p = bp.fwd;
    const int h = blockIdx.y;
    // The item once for every role (its lookups are ~250 instructions a copy: cold code on a short item),
    // longest first with the sequence order (item_sequence_and_head)
    const BackwardItem item = backward_item(bp, item_sequence_and_head(p).x, h);
    if (!item.valid) return;
    if (threadIdx.x == 0) tma::init_ring(s.ready, s.free, 128, 256);
    __syncthreads();
    const int role = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    if (role == 0) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Rs::kAuxRegisters));
      zero_upper_p(s);  // made visible to the state groups' wgmmas by the first chunk's fence
      Rs::template aux_loop<true, true>(p, maps, s, true, h / (p.num_v_heads / p.num_qk_heads), h,
                                        [&] { return ring_item(item); }, [&](int64_t, int buf, auto&&) {
                                          chunk_operands(s.slot[buf], s.gcum[buf], s.factors[buf], p.scale);
                                          wg::fence_shared_to_async();  // the operands, for the state groups
                                        });
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Rs::kStateRegisters));
      run_state(bp, item, grad_map, s, h, role - 1);
    }
  }
};

// grad_map: bp.chunk_grad_states' map in the main mode (encode_panel_map, 64-row boxes), else unused.
template <typename Elem>
__global__ void __launch_bounds__(384, 1) backward_ds_pass_kernel(const __grid_constant__ BackwardParams bp,
                                                                  const __grid_constant__ ForwardTileMaps maps,
                                                                  const __grid_constant__ CUtensorMap grad_map) {
  wait_for_previous_grid();
  release_next_grid();
  BackwardDsPass<Elem>::run(bp, maps, grad_map);
}

}  // namespace flashgdn::kern
