// Fused chunked backward: one CTA walks the chunks of one (sequence, v-head) from last to first
// with dS (the gradient of the state leaving the chunk) in fp32 registers, recomputing the chunk's
// forward quantities from its inputs, the saved entering state S and the gate-free inverse A_r.
// The equations are those of src/reference/backward_chunked.cpp (checked there in float64).
//
// Grid  (N sequences or CP segments, Hv); block 256 threads = 8 warps, mma.sync m16n8k16 (bf16/fp16 operands,
// fp32 accumulate). Three warp tilings:
//   [64,128] products: rows 32*(warp%2), cols 32*(warp/2)    (2 x 4 fragments)
//   [64,64]  products: rows 16*(warp%4), cols 32*(warp/4)    (1 x 4 fragments)
//   [128,128] dS:      rows 32*(warp%4), cols 64*(warp/4)    (2 x 8 fragments, for the whole sequence)
// Products that meet elementwise (P and dPg, Ag and dAg, dL and KK) share a tiling, so each
// thread combines its own fp32 accumulators: no fp32 matrix passes through shared memory.
//
// Shared memory (Elem rows padded to 136 / 72 elements, 226.6 KiB):
//   kq [128][136]      K rows 0-63, Q rows 64-127
//   state, dstate [128][136]   S^T entering the chunk (chunk_states' layout), bf16 copy of dS
//   w [64][136]        V, then W = V - Gamma U in place
//   du_do [128][136]   rows 0-63 dU, rows 64-127 dO (s Gamma dO from phase 4), so that
//                      [K; Q]^T [dU; s Gamma dO] is one K = 128 product
//   vd, dvd [64][136]  Vd, dVd; from phase 4 X and dM + dM^T ([64][72])
//   pg, ag, ar, dp [64][72]   s G (.) P, G (.) A_r (.) 1 beta^T, A_r; dA_r replaces pg in phase 3
//   gcum, beta [64]    gcum in log2 units (every decay factor is one ex2)
//   dgs_part [8][64], dbeta_part [4][64], dot_part [8], ka_part [8]: per-warp partial sums,
//                      added in a fixed order (the backward is deterministic)
//
// Per chunk (Gamma = diag(e^g), rho = e^{gamma - g}, G[i,j] = e^{g_i - g_j} for i >= j, s = scale):
//   phase 1  U [64,128] = K @ S;  W = V - Gamma U                                   -> w
//            P [64,64] = Q @ K^T;  s G (.) P                                      -> pg
//            A_r from HBM (fp32);  Ag = G (.) A_r (.) 1 beta^T                     -> ag, ar
//            <dS, S>                                                               -> dot_part
//   phase 2  Vd  [64,128] = Ag @ W                                                 -> vd
//            dVd [64,128] = rho (.) (K @ dS) + (s G (.) P)^T @ dO                  -> dvd
//   phase 3  P again (registers);  dPg [64,64] = dO @ Vd^T;  dP = s G (.) dPg         -> dp
//            dAg [64,64] = dVd @ W^T;  dA_r = dAg (.) G (.) 1 beta^T               -> pg slot
//            E = Pg (.) dPg + Ag (.) dAg:  dg_s += rowsum(E) - colsum(E);  dbeta += colsum(dAg G A_r)
//            dW [64,128] = Ag^T @ dVd  -> dv (HBM);  dU = -Gamma dW                -> du_do rows 0-63
//            dQ_a [64,128] = s Gamma (dO @ S^T)   (registers; dg_s += rowsum(Q (.) dQ_a))
//            dK_a [64,128] = rho (.) (Vd @ dS^T)  (registers; a = rowsum(K (.) dK_a))
//   phase 4  X [64,64] = A_r^T @ dA_r                                              -> vd slot
//            dO -> s Gamma dO in place
//            dL = -StrictLower(X @ A_r^T);  KK = K @ K^T:  dbeta += rowsum(dL (.) KK)
//            dM + dM^T with dM = diag(beta) dL                                     -> dvd slot
//   phase 5  dq_h [64,128] = dQ_a + dP @ K                                         -> dq_heads (HBM)
//            dk_h [64,128] = dK_a + dU @ S^T + dP^T @ Q + (dM + dM^T) @ K          -> dk_heads (HBM)
//                     (dg_s += rowsum(K (.) (dK_a + dU S^T)) - 2a: the U and rho terms of dg_s,
//                      using rowsum(dU (.) U) = rowsum(K (.) (dU @ S^T)))
//            dS [128,128] = e^gamma dS + [K; Q]^T @ [dU; s Gamma dO]
//   then     dgamma = e^gamma <dS, S> + sum(a) added to dg_s of the last row; dg = reverse cumsum
//            of dg_s over the chunk -> dg, dbeta (HBM)
// After the first chunk, dS is d_initial_state. With CP the CTAs are segments (backward_item below).
#pragma once

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

// What one CTA of the fused backward does. Without CP, x is a sequence: all its chunks from dht to
// dh0. With CP, x is a segment j of sequence n:
//   dS* pass (fused_backward_ds.cuh, fwd.cp_pass == kCpStatePass), j >= 1 (every j with p.shard): the
//     segment's leading decay window (the whole segment without one) from dS = 0 -> segment_grad_starts[x]
//   main pass: the segment from dS_{j+1} (dht for the last segment, else segment_grad_ends[x]);
//     every gradient of its tokens; dh0 from the first segment
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
struct FusedBackward {
  static constexpr int kThreads = 256;
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kPitchC = kChunk + 8;

  struct SharedStorage {
    alignas(16) Elem kq[2 * kChunk * kPitch];
    alignas(16) Elem state[kHeadDim * kPitch];
    alignas(16) Elem dstate[kHeadDim * kPitch];
    alignas(16) Elem w[kChunk * kPitch];
    alignas(16) Elem du_do[2 * kChunk * kPitch];
    alignas(16) Elem vd[kChunk * kPitch];
    alignas(16) Elem dvd[kChunk * kPitch];
    alignas(16) Elem pg[kChunk * kPitchC];
    alignas(16) Elem ag[kChunk * kPitchC];
    alignas(16) Elem ar[kChunk * kPitchC];
    alignas(16) Elem dp[kChunk * kPitchC];
    float gcum[kChunk];
    float beta[kChunk];
    float dgs_part[8][kChunk];
    float dbeta_part[4][kChunk];
    float dot_part[8];
    float ka_part[8];
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "one CTA per SM must fit");

  using Tile64x128 = float[2][4][4];
  using Tile64x64 = float[1][4][4];

  // f(row, col, value&) over the accumulator elements of a warp tile at (m0, n0).
  template <int MT, int NT, typename F>
  static __device__ __forceinline__ void for_each(float (&acc)[MT][NT][4], int m0, int n0, F&& f) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(acc_row(m0, i, e), acc_col(n0, j, e), acc[i][j][e]);
  }

  // Sum of x over the 4 lanes sharing an accumulator row; lane % 4 == 0 adds it to dst[row].
  static __device__ __forceinline__ void add_row_sum(float* dst, int row, float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    if (threadIdx.x % 4 == 0) dst[row] += x;
  }
  // Sum of x over the 8 lanes sharing an accumulator column; lanes 0-3 add it to dst[col].
  static __device__ __forceinline__ void add_col_sum(float* dst, int col, float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 16);
    if (threadIdx.x % 32 < 4) dst[col] += x;
  }
  // Row sums of a [64,128]-tiling product against an Elem tile (x (.) acc, summed over columns),
  // times `sign`, added to dst; returns this thread's share of their unscaled total.
  static __device__ __forceinline__ float add_row_dots(float* dst, const Tile64x128& acc, const Elem* x, int m0,
                                                       int n0, float sign) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = acc_row(m0, i, 2 * half);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = acc_col(n0, j, 0);
          sum += to_float(x[row * kPitch + col]) * acc[i][j][2 * half] +
                 to_float(x[row * kPitch + col + 1]) * acc[i][j][2 * half + 1];
        }
        total += sum;
        add_row_sum(dst, row, sign * sum);
      }
    return total;
  }

  // K, Q, V, dO rows of the chunk (zero past the valid rows) and the entering state S^T (chunk_states).
  static __device__ void load_chunk(const BackwardParams& bp, SharedStorage& s, int64_t b, int64_t t0, int rows,
                                    int hk, int h, int64_t chunk_id) {
    const ForwardParams& p = bp.fwd;
    // Thread t copies 16-byte vector t % 16 of rows t / 16 + 16 j of each tile, from the chunk's
    // (CTA-uniform) first row plus row * token stride.
    const int vec = threadIdx.x % 16;
    const Elem* k_rows = row_ptr<Elem>(p.k, p.k_strides, b, t0, hk) + vec * 8;
    const Elem* q_rows = row_ptr<Elem>(p.q, p.q_strides, b, t0, hk) + vec * 8;
    const Elem* v_rows = row_ptr<Elem>(p.v, p.v_strides, b, t0, h) + vec * 8;
    const Elem* do_rows = row_ptr<Elem>(bp.d_o, bp.d_o_strides, b, t0, h) + vec * 8;
#pragma unroll 1
    for (int row = threadIdx.x / 16; row < kChunk; row += kThreads / 16) {
      const bool in_chunk = row < rows;
      const int64_t src_row = in_chunk ? row : 0;
      cp_async_16(&s.kq[row * kPitch + vec * 8], k_rows + src_row * p.k_strides.token, in_chunk);
      cp_async_16(&s.kq[(kChunk + row) * kPitch + vec * 8], q_rows + src_row * p.q_strides.token, in_chunk);
      cp_async_16(&s.w[row * kPitch + vec * 8], v_rows + src_row * p.v_strides.token, in_chunk);
      cp_async_16(&s.du_do[(kChunk + row) * kPitch + vec * 8], do_rows + src_row * bp.d_o_strides.token, in_chunk);
    }
    const Elem* saved = static_cast<const Elem*>(p.chunk_states) + (chunk_id * p.num_v_heads + h) * (kHeadDim * kHeadDim);
    for (int e = threadIdx.x; e < kHeadDim * 16; e += kThreads) {
      const int row = e / 16, vec = e % 16;
      cp_async_16(&s.state[row * kPitch + vec * 8], saved + row * kHeadDim + vec * 8, true);
    }
    cp_async_commit();
  }

  // A_r[row][col] (fp32 from the inverse workspace), 0 past the valid rows or above the diagonal.
  static __device__ __forceinline__ float inverse_at(const ForwardParams& p, int64_t b, int64_t t0, int rows,
                                                     int h, int row, int col) {
    if (row >= rows || col > row) return 0.f;
    return static_cast<const float*>(p.inverse)[((b * p.seqlen + t0 + row) * p.num_v_heads + h) * kChunk + col];
  }

  static __device__ void run(const BackwardParams& bp) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const ForwardParams& p = bp.fwd;
    const int h = blockIdx.y;
    const BackwardItem item = backward_item(bp, blockIdx.x, h);
    if (!item.valid) return;
    const int hk = h / (p.num_v_heads / p.num_qk_heads);
    const int64_t b = item.batch;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float scale = p.scale;
    // Warp tiles of the three tilings.
    const int wm = 32 * (warp % 2), wn = 32 * (warp / 2);       // [64,128]
    const int cm = 16 * (warp % 4), cn = 32 * (warp / 4);       // [64,64]
    const int sm = 32 * (warp % 4), sn = 64 * (warp / 4);       // [128,128]
    const Elem* k_tile = s.kq;
    const Elem* q_tile = s.kq + kChunk * kPitch;
    Elem* du = s.du_do;
    Elem* d_o = s.du_do + kChunk * kPitch;

    float dstate[2][8][4];  // gradient states are fp32
    const float* ds_end = static_cast<const float*>(item.ds_end.base);
    for_each(dstate, sm, sn, [&](int row, int col, float& x) {
      x = ds_end == nullptr ? 0.f : ds_end[row * item.ds_end.k_stride + col * item.ds_end.v_stride];
    });

    const int64_t num_chunks = (item.eos - item.bos + kChunk - 1) / kChunk;
    for (int64_t c = num_chunks - 1; c >= 0; --c) {
      const int64_t t0 = item.bos + c * kChunk;
      const int rows = static_cast<int>(item.eos - t0 < kChunk ? item.eos - t0 : kChunk);
      __syncthreads();  // the previous chunk is done with every buffer
      load_chunk(bp, s, b, t0, rows, hk, h, item.first_chunk_id + c);
      if (warp == 0) load_chunk_gates(p, s.gcum, s.beta, b, t0, rows, h);
      static_assert(sizeof(s.dgs_part) == 2 * kThreads * sizeof(float), "two dgs_part slots per thread");
      float* dgs_slots = &s.dgs_part[0][0];
      dgs_slots[threadIdx.x] = 0.f;
      dgs_slots[threadIdx.x + kThreads] = 0.f;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2)
            store_pair(&s.dstate[acc_row(sm, i, e) * kPitch + acc_col(sn, j, e)], dstate[i][j][e],
                       dstate[i][j][e + 1]);
      cp_async_wait<0>();
      __syncthreads();
      const float gamma = s.gcum[kChunk - 1];

      // ── Phase 1 ──────────────────────────────────────────────────────────────────────────────
      {  // W = V - Gamma (K @ S)
        float acc[2][4][4];
        zero(acc);
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kTransposed>(acc, k_tile, kPitch, s.state, kPitch, wm, wn, kHeadDim);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = acc_row(wm, i, 2 * half);
            const float decay = exp2_approx(s.gcum[row]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              Elem* x = &s.w[row * kPitch + acc_col(wn, j, 0)];
              store_pair(x, to_float(x[0]) - decay * acc[i][j][2 * half],
                         to_float(x[1]) - decay * acc[i][j][2 * half + 1]);
            }
          }
      }
      {
        float qk[1][4][4];  // P = Q @ K^T
        zero(qk);
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(qk, q_tile, kPitch, k_tile, kPitch, cm, cn, kHeadDim);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int row = acc_row(cm, 0, e), col = acc_col(cn, j, e);
            float pg[2], ag[2], ar[2];
#pragma unroll
            for (int d = 0; d < 2; ++d) {
              const bool lower = row >= col + d;
              const float gate = lower ? exp2_approx(s.gcum[row] - s.gcum[col + d]) : 0.f;
              pg[d] = scale * gate * qk[0][j][e + d];
              ar[d] = inverse_at(p, b, t0, rows, h, row, col + d);
              ag[d] = gate * ar[d] * s.beta[col + d];
            }
            store_pair(&s.pg[row * kPitchC + col], pg[0], pg[1]);
            store_pair(&s.ag[row * kPitchC + col], ag[0], ag[1]);
            store_pair(&s.ar[row * kPitchC + col], ar[0], ar[1]);
          }
      }
      {  // <dS, S> over this thread's dS elements
        float dot = 0.f;
        for_each(dstate, sm, sn, [&](int row, int col, float& x) { dot += x * to_float(s.state[col * kPitch + row]); });
        dot = warp_sum(dot);
        if (lane == 0) s.dot_part[warp] = dot;
      }
      __syncthreads();

      // ── Phase 2 ──────────────────────────────────────────────────────────────────────────────
      {
        float acc[2][4][4];
        {
          zero(acc);  // Vd = Ag @ W
          warp_gemm<2, 4, Stored::kRowMajor, Stored::kRowMajor>(acc, s.ag, kPitchC, s.w, kPitch, wm, wn, kChunk);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int e = 0; e < 4; e += 2)
                store_pair(&s.vd[acc_row(wm, i, e) * kPitch + acc_col(wn, j, e)], acc[i][j][e], acc[i][j][e + 1]);
        }
        zero(acc);  // dVd = rho (.) (K @ dS) + Pg^T @ dO
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kRowMajor>(acc, k_tile, kPitch, s.dstate, kPitch, wm, wn, kHeadDim);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float rho = exp2_approx(gamma - s.gcum[acc_row(wm, i, 2 * half)]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              acc[i][j][2 * half] *= rho;
              acc[i][j][2 * half + 1] *= rho;
            }
          }
        warp_gemm<2, 4, Stored::kTransposed, Stored::kRowMajor>(acc, s.pg, kPitchC, d_o, kPitch, wm, wn, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2)
              store_pair(&s.dvd[acc_row(wm, i, e) * kPitch + acc_col(wn, j, e)], acc[i][j][e], acc[i][j][e + 1]);
      }
      __syncthreads();

      // ── Phase 3 ──────────────────────────────────────────────────────────────────────────────
      float* dgs = s.dgs_part[warp];
      {
        float qk[1][4][4];  // P = Q @ K^T again (cheaper than keeping it live through phase 2)
        zero(qk);
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(qk, q_tile, kPitch, k_tile, kPitch, cm, cn, kHeadDim);
        float dpg[1][4][4];  // dPg = dO @ Vd^T
        zero(dpg);
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(dpg, d_o, kPitch, s.vd, kPitch, cm, cn, kHeadDim);
        float dag[1][4][4];  // dAg = dVd @ W^T
        zero(dag);
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(dag, s.dvd, kPitch, s.w, kPitch, cm, cn, kHeadDim);
        float row_e[2] = {0.f, 0.f};  // rows cm + lane/4 and + 8
        float col_e[4][2], col_beta[4][2];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int d = 0; d < 2; ++d) col_e[j][d] = col_beta[j][d] = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int row = acc_row(cm, 0, e), col = acc_col(cn, j, e);
            float dp[2], dar[2];
#pragma unroll
            for (int d = 0; d < 2; ++d) {
              const bool lower = row >= col + d;
              const float gate = lower ? exp2_approx(s.gcum[row] - s.gcum[col + d]) : 0.f;
              const float ar = inverse_at(p, b, t0, rows, h, row, col + d);
              dp[d] = scale * gate * dpg[0][j][e + d];
              const float t = dag[0][j][e + d] * gate;  // dAg (.) G
              dar[d] = t * s.beta[col + d];
              const float energy = dp[d] * qk[0][j][e + d] + dar[d] * ar;  // Pg dPg + Ag dAg
              row_e[e / 2] += energy;
              col_e[j][d] += energy;
              col_beta[j][d] += t * ar;
            }
            store_pair(&s.dp[row * kPitchC + col], dp[0], dp[1]);
            store_pair(&s.pg[row * kPitchC + col], dar[0], dar[1]);
          }
#pragma unroll
        for (int half = 0; half < 2; ++half) add_row_sum(dgs, acc_row(cm, 0, 2 * half), row_e[half]);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int d = 0; d < 2; ++d) {
            const int col = acc_col(cn, j, d);
            add_col_sum(dgs, col, -col_e[j][d]);
            __syncwarp();
            // dbeta_part[warp % 4] is written by this warp alone in phase 3: assign.
            float x = col_beta[j][d];
            x += __shfl_xor_sync(0xffffffffu, x, 4);
            x += __shfl_xor_sync(0xffffffffu, x, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 16);
            if (lane < 4) s.dbeta_part[warp % 4][col] = x;
          }
      }
      {  // dW = Ag^T @ dVd -> dv;  dU = -Gamma dW
        float acc[2][4][4];
        zero(acc);
        warp_gemm<2, 4, Stored::kTransposed, Stored::kRowMajor>(acc, s.ag, kPitchC, s.dvd, kPitch, wm, wn, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = acc_row(wm, i, 2 * half);
            const float decay = exp2_approx(s.gcum[row]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int col = acc_col(wn, j, 0);
              const float x0 = acc[i][j][2 * half], x1 = acc[i][j][2 * half + 1];
              if (row < rows)
                store_pair(static_cast<Elem*>(bp.dv) + b * bp.dv_strides.batch + (t0 + row) * bp.dv_strides.token +
                               h * bp.dv_strides.head + col,
                           x0, x1);
              store_pair(&du[row * kPitch + col], -decay * x0, -decay * x1);
            }
          }
      }
      float dq_acc[2][4][4], dk_acc[2][4][4];
      {
        zero(dq_acc);  // dQ_a = s Gamma (dO @ S^T)
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kRowMajor>(dq_acc, d_o, kPitch, s.state, kPitch, wm, wn, kHeadDim);
        zero(dk_acc);  // dK_a = rho (.) (Vd @ dS^T)
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kTransposed>(dk_acc, s.vd, kPitch, s.dstate, kPitch, wm, wn, kHeadDim);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = acc_row(wm, i, 2 * half);
            const float qf = scale * exp2_approx(s.gcum[row]), rho = exp2_approx(gamma - s.gcum[row]);
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int d = 0; d < 2; ++d) {
                dq_acc[i][j][2 * half + d] *= qf;
                dk_acc[i][j][2 * half + d] *= rho;
              }
          }
        __syncwarp();
        add_row_dots(dgs, dq_acc, q_tile, wm, wn, 1.f);
        __syncwarp();
        {  // a = rowsum(K (.) dK_a): dg_s -= 2a now, + rowsum(K (.) (dK_a + dU S^T)) in phase 5
          float total = add_row_dots(dgs, dk_acc, k_tile, wm, wn, -2.f);
          total = warp_sum(total);
          if (lane == 0) s.ka_part[warp] = total;
        }
      }
      __syncthreads();

      // ── Phase 4 ──────────────────────────────────────────────────────────────────────────────
      Elem* x_tile = s.vd;       // X = A_r^T dA_r, pitch kPitchC
      Elem* dm_sym = s.dvd;      // dM + dM^T, pitch kPitchC
      {
        float acc[1][4][4];
        zero(acc);
        warp_gemm<1, 4, Stored::kTransposed, Stored::kRowMajor>(acc, s.ar, kPitchC, s.pg, kPitchC, cm, cn, kChunk);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2)
            store_pair(&x_tile[acc_row(cm, 0, e) * kPitchC + acc_col(cn, j, e)], acc[0][j][e], acc[0][j][e + 1]);
      }
      for (int e = threadIdx.x; e < kChunk * kHeadDim / 2; e += kThreads) {  // dO -> s Gamma dO
        const int row = e / (kHeadDim / 2), col = 2 * (e % (kHeadDim / 2));
        const float f = scale * exp2_approx(s.gcum[row]);
        Elem* x = &d_o[row * kPitch + col];
        store_pair(x, f * to_float(x[0]), f * to_float(x[1]));
      }
      __syncthreads();
      {
        float y[1][4][4];  // Y = X @ A_r^T
        zero(y);
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(y, x_tile, kPitchC, s.ar, kPitchC, cm, cn, kChunk);
        float kk[1][4][4];  // KK = K @ K^T
        zero(kk);
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(kk, k_tile, kPitch, k_tile, kPitch, cm, cn, kHeadDim);
        float row_beta[2] = {0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = acc_row(cm, 0, e), col = acc_col(cn, j, e);
            const float dl = row > col ? -y[0][j][e] : 0.f;
            row_beta[e / 2] += dl * kk[0][j][e];
            const float dm = s.beta[row] * dl;
            if (row >= col) {
              dm_sym[row * kPitchC + col] = to_elem<Elem>(dm);
              if (row > col) dm_sym[col * kPitchC + row] = to_elem<Elem>(dm);
            }
          }
        // dbeta_part[warp / 4] rows cm..cm+15: this warp alone in phase 4, after phase 3's writes.
#pragma unroll
        for (int half = 0; half < 2; ++half) add_row_sum(s.dbeta_part[warp / 4], acc_row(cm, 0, 2 * half), row_beta[half]);
      }
      __syncthreads();

      // ── Phase 5 ──────────────────────────────────────────────────────────────────────────────
      {
        // dq_h = dQ_a + dP @ K
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kRowMajor>(dq_acc, s.dp, kPitchC, k_tile, kPitch, wm, wn, kChunk);
        // dk_h = dK_a + dU @ S^T (+ the U and rho terms of dg_s) + dP^T @ Q + (dM + dM^T) @ K
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kRowMajor>(dk_acc, du, kPitch, s.state, kPitch, wm, wn, kHeadDim);
        add_row_dots(dgs, dk_acc, k_tile, wm, wn, 1.f);
        warp_gemm<2, 4, Stored::kTransposed, Stored::kRowMajor>(dk_acc, s.dp, kPitchC, q_tile, kPitch, wm, wn, kChunk);
        warp_gemm<2, 4, Stored::kRowMajor, Stored::kRowMajor>(dk_acc, dm_sym, kPitchC, k_tile, kPitch, wm, wn, kChunk);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
              const int row = acc_row(wm, i, e), col = acc_col(wn, j, e);
              if (row < rows) {
                const int64_t out = ((b * p.seqlen + t0 + row) * p.num_v_heads + h) * kHeadDim + col;
                if (bp.direct_qk) {  // h is its own q/k head
                  const int64_t t = t0 + row;
                  store_pair(static_cast<Elem*>(bp.dq) + b * bp.dq_strides.batch + t * bp.dq_strides.token +
                                 h * bp.dq_strides.head + col,
                             dq_acc[i][j][e], dq_acc[i][j][e + 1]);
                  store_pair(static_cast<Elem*>(bp.dk) + b * bp.dk_strides.batch + t * bp.dk_strides.token +
                                 h * bp.dk_strides.head + col,
                             dk_acc[i][j][e], dk_acc[i][j][e + 1]);
                } else {
                  *reinterpret_cast<float2*>(bp.dq_heads + out) = make_float2(dq_acc[i][j][e], dq_acc[i][j][e + 1]);
                  *reinterpret_cast<float2*>(bp.dk_heads + out) = make_float2(dk_acc[i][j][e], dk_acc[i][j][e + 1]);
                }
              }
            }
      }
      {  // dS = e^gamma dS + [K; Q]^T @ [dU; s Gamma dO]
        const float decay = exp2_approx(gamma);
        for_each(dstate, sm, sn, [&](int, int, float& x) { x *= decay; });
        warp_gemm<2, 8, Stored::kTransposed, Stored::kRowMajor>(dstate, s.kq, kPitch, s.du_do, kPitch, sm, sn,
                                                                2 * kChunk);
      }
      __syncthreads();

      // dgamma, then dg = reverse cumsum of dg_s over the chunk (warp 0, two rows per lane).
      if (warp == 0) {
        float dot = 0.f, ka = 0.f;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
          dot += s.dot_part[w];
          ka += s.ka_part[w];
        }
        float dgs_row[2], dbeta_row[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = 2 * lane + i;
          float x = 0.f;
#pragma unroll
          for (int w = 0; w < 8; ++w) x += s.dgs_part[w][row];
          if (row == kChunk - 1) x += exp2_approx(gamma) * dot + ka;
          dgs_row[i] = x;
          dbeta_row[i] = s.dbeta_part[0][row] + s.dbeta_part[1][row] + s.dbeta_part[2][row] + s.dbeta_part[3][row];
        }
        // Suffix sum over rows: lane l holds rows 2l, 2l+1.
        const float pair = dgs_row[0] + dgs_row[1];
        float suffix = pair;
#pragma unroll
        for (int offset = 1; offset < 32; offset *= 2) {
          const float down = __shfl_down_sync(0xffffffffu, suffix, offset);
          if (lane + offset < 32) suffix += down;
        }
        const float dg_row[2] = {suffix, suffix - dgs_row[0]};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = 2 * lane + i;
          if (row < rows) {
            const int64_t t = t0 + row;
            bp.dg[b * bp.dg_strides.batch + t * bp.dg_strides.token + h * bp.dg_strides.head] = dg_row[i];
            const int64_t off = b * bp.dbeta_strides.batch + t * bp.dbeta_strides.token + h * bp.dbeta_strides.head;
            if (p.beta_is_bf16)
              static_cast<__nv_bfloat16*>(bp.dbeta)[off] = __float2bfloat16_rn(dbeta_row[i]);
            else
              static_cast<float*>(bp.dbeta)[off] = dbeta_row[i];
          }
        }
      }
    }

    // Resolved again rather than kept live through the chunk loop (registers are at the limit).
    if (const StateBlock out = backward_item(bp, blockIdx.x, h).ds_start; out.base != nullptr) {
      float* ds_start = static_cast<float*>(out.base);  // gradient states are fp32
      for_each(dstate, sm, sn, [&](int row, int col, float& x) { ds_start[row * out.k_stride + col * out.v_stride] = x; });
    }
  }
};

template <typename Elem>
__global__ void __launch_bounds__(256, 1) fused_backward_kernel(const __grid_constant__ BackwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  FusedBackward<Elem>::run(p);
}

}  // namespace flashgdn::kern
