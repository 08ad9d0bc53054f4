// Gate-free chunk inverse:  A_r = (I + StrictLower(diag(beta) K K^T))^{-1}  per (chunk, v-head).
//
// Grid  (max_chunks, ceil((Hv / Hqk) / heads per CTA), Hqk); block 256 threads (8 warps): one CTA
// per chunk and group of up to 4 v-heads sharing a q/k head (GQA), so K's load and K K^T are done
// once for them (fewer where the grid would have under 2 CTAs a SM: heads_per_cta).
// No gates anywhere (DESIGN §1, gate extraction: the fused kernel re-applies G elementwise).
// Shared memory (34 KiB with fp16 merges, 43 KiB with split ones; 6 or 5 CTAs per SM by registers with the
// 16-bit inverse (chunk_inverse_ctas_per_sm), 4 with the fp32 one): K
// tile [64][136] bf16 (padded rows), sharing its bytes with X = A_r, one fp16 tile [64][72] (warp_mma.cuh
// HalfTile) for fp16 merges, kept split for bf16x3 merges (SplitTile: bf16 hi + lo [64][72] each; the
// fp32 inverse with kSplitMerges, launch.h's InverseMerges); K is dead once K K^T is formed; StrictLower(K K^T) the same way (its blocks
// below the diagonal only: nothing reads the others), its diagonal blocks in fp32 [4][16][16] (unmasked: stage 2 reads
// the entries below the diagonal); beta, gcum and the gated write's column factors [4 heads][64].
// Stages (16 x 16 blocks, X_ij for block row i and block column j; L = diag(beta) StrictLower(K K^T),
// its row scaling applied where L is used):
//   1. KK^T        [64,64] = K[64,128] @ K^T[128,64]        (mma.sync, 8 warps x [16,32] tiles; the
//      two tiles wholly above the diagonal are skipped: their warps 4 and 5 store the gates, whose
//      loads they issued before the K tile's barrier), strictly lower part kept; once per CTA
//   then per v-head of the group:
//   2. X_ii = (I + L_ii)^{-1}: warp i / 2, lane 16 (i % 2) + c solves column c by forward substitution in
//      registers (its column's entries above the diagonal come out as exact zeros)
//   3. for block rows i = 1, 2, 3, warp w < 2 i owning the 8 columns 8 w .. 8 w + 7 of the 16 i:
//        T [16, 8]           = diag(beta_i) KK^T_{i, j:i} [16, 16 (i - j)] @ X_{j:i, 8w..} [16 (i - j), 8]
//        X_{i, 8w..} [16, 8] = -X_ii [16,16] @ T [16, 8]                                  (j = w / 2)
//      on tensor cores (mma_merge): with kSplitMerges in bf16x3 (each fp32 operand split into bf16
//      hi + lo; hi.hi + hi.lo + lo.hi with fp32 accumulation: about 2^-16 relative error per
//      product: the fp32 inverse for any keys), else in plain fp16 (one product; bench/forward_precision:
//      the forward's o within 1.3% of bf16x3's error, bench/precision_study's pre+inv16: no gradient's
//      error moves by 2% of itself; |X| <= ~2 while beta |k|^2 <= 2, fp16's range otherwise at
//      stake, as in v5). KK^T and X fragments come by ldmatrix from their tiles; T stays in
//      registers (movmatrix turns its accumulator into the B fragment), so a block row needs one
//      barrier; X_{kb, j} = 0 above the block diagonal is skipped, never formed.
// Output: rows of the chunk's valid tokens, 64 values each, at inverse[(b*T + t)*Hv + h][0:64], in
// 16-byte vectors (entries above the diagonal are written as zeros; the fp32 inverse with fp16 merges
// writes fp16 rows where p.inverse_rows_fp16 is set, exact); with p.gated_inverse (v4's
// forward) Ag = G (.) A_r (.) 1 beta^T in the input dtype in their place; the fp32 inverse with
// p.gated_inverse_out (the backward) writes Ag there as well. InverseT = __half (the forward keeping
// the inverse cache): the 16-bit inverse's fp16 rows beside Ag (p.gated_inverse_out), the same bytes as
// the fp32 inverse's with fp16 merges and rows (the same fp16 X tile formed by the same code: the rows
// are its bits, Ag the same products of its values), at the 16-bit kernel's 5 or 6 CTAs a SM, not 4;
// where p.chunk_gates is set,
// the gate warp of head v (warps 4 and 5, during stage 1) also writes its gate record
// (chunk_gates.cuh: gcum | beta) at [chunk id][h], and
// where p.chunk_window_terms is set (CP, forward and backward), head v's window term of the chunk
// (sum of g_t + log max(1, |1 - beta_t |k_t|^2|), |k_t|^2 from K K^T's diagonal) at [chunk id][h].
#pragma once

#include <type_traits>

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/params.h"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {

// InverseT: the rows' storage: float (the fp32 inverse; fp16 rows where p.inverse_rows_fp16),
// __nv_bfloat16 (the 16-bit inverse: A_r, or Ag in its place), __half (the 16-bit inverse's fp16 rows,
// always beside Ag).
template <typename Elem, typename InverseT, bool kSplitMerges>
struct ChunkInverse {
  static constexpr int kThreads = 256;
  static constexpr int kPitchK = kHeadDim + 8;  // bf16 elements per K row in shared memory
  static constexpr int kPitchX = kChunk + 8;    // bf16 elements per row of the split tiles
  static constexpr int kMaxHeadsPerCta = 4;      // v-heads of one q/k head per CTA (GQA)
  static constexpr int kFirstGateWarp = 4;  // warps 4 and 5 fetch and store the gates (heads w - 4, w - 2)
  // The merges' operands (launch.h's InverseMerges): split for bf16x3 (the fp32 inverse for any keys),
  // else plain fp16 (the 16-bit inverse, as v5's in-kernel one; the backward's fp32 one by default).
  static_assert(!kSplitMerges || std::is_same_v<InverseT, float>, "split merges for the fp32 inverse only");
  using MergeTile = std::conditional_t<kSplitMerges, SplitTile<kChunk, kPitchX>, HalfTile<kChunk, kPitchX>>;

  struct SharedStorage {
    union {
      alignas(16) Elem k[kChunk * kPitchK];
      MergeTile x;
    };
    MergeTile kk;               // StrictLower(K K^T)
    float kk_diag[4][16][16];  // its diagonal blocks in fp32
    float k_norm2[kChunk];     // K K^T's diagonal, |k_t|^2 (the window terms)
    alignas(16) float beta[kMaxHeadsPerCta][kChunk];
    alignas(16) float gcum[kMaxHeadsPerCta][kChunk];  // log2 units (chunk_gates.cuh)
    alignas(16) float col_factor[kMaxHeadsPerCta][kChunk];  // gated: 2^(gcum_e - gcum_t) beta_t (write_rows)
    int64_t token_row;  // b T + t of the chunk's row 0 (the output rows'; thread 0, before stage 1)
    int rows;           // the chunk's valid rows
  };

  // The CTA's v-heads: `count` heads from `first`, all of q/k head hk = blockIdx.z (blockIdx.y = its group of
  // p.inverse_heads_per_cta: one division fewer per thread than hk * groups + group in y, whose
  // quotient and remainder cost two 32-bit divisions by a runtime divisor).
  struct HeadGroup {
    int hk, first, count;
  };
  static __host__ __device__ int groups_per_qk_head(const ForwardParams& p) {
    return (p.num_v_heads / p.num_qk_heads + p.inverse_heads_per_cta - 1) / p.inverse_heads_per_cta;
  }
  static __device__ HeadGroup head_group(const ForwardParams& p) {
    const int per_qk = p.num_v_heads / p.num_qk_heads;
    const int hk = blockIdx.z, first = blockIdx.y * p.inverse_heads_per_cta;
    return {hk, hk * per_qk + first, min(p.inverse_heads_per_cta, per_qk - first)};
  }
  // Heads per CTA: up to kMaxHeadsPerCta (K's load and K K^T shared), halved while the grid has fewer
  // than `min_ctas` CTAs (the launcher: 2 a SM). Measured on the H200 (session 21, forced 1 / 2 / 4):
  // (2,8) 8 x 1024 20.1 / 15.8 / 17.5 us (256 CTAs of 4 heads leave SMs idle), (4,16) 4 x 2048
  // 36.5 / 29.2 / 25.7, (2,8) 1 x 32768 69.8 / 55.5 / 47.5: more heads a CTA win as long as the grid
  // has ~2 CTAs a SM, even where fewer heads would make a whole wave of 5 a SM.
  static int heads_per_cta(const ForwardParams& p, int64_t min_ctas) {
    const int per_qk = p.num_v_heads / p.num_qk_heads;
    int heads = per_qk < kMaxHeadsPerCta ? per_qk : kMaxHeadsPerCta;
    const auto ctas = [&](int h) { return p.max_chunks * p.num_qk_heads * ((per_qk + h - 1) / h); };
    while (heads > 1 && ctas(heads) < min_ctas) heads /= 2;
    return heads;
  }

  // Whether Ag is written: beside the rows (the fp32 inverse's where p.gated_inverse_out is set, always
  // beside the fp16 rows of InverseT = __half) or in their place (p.gated_inverse, bf16 rows).
  static __device__ __forceinline__ bool writes_ag(const ForwardParams& p) {
    if constexpr (std::is_same_v<InverseT, float>)
      return p.gated_inverse_out != nullptr;
    else if constexpr (std::is_same_v<InverseT, __half>)
      return true;
    else
      return p.gated_inverse;
  }

  // kOneHead: the build for one v-head a CTA (chunk_inverse_ctas_per_sm's 6-CTA kernel, launched only
  // where a CTA takes one head): the head loop's single pass at compile time (no loop counter live
  // through it, no trailing barrier; the solves fit its 40 registers).
  template <bool kOneHead = false>
  static __device__ void run(const ForwardParams& p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const HeadGroup heads = head_group(p);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    ChunkLocation where;
    if (!locate_chunk(p, blockIdx.x, where)) return;
    const int64_t b = where.seq.batch;
    // The output rows' base and the valid rows, for the writes after stage 3: from shared memory there,
    // so that b and the chunk's location need no registers through stages 1-3 (the solves' 40).
    if (threadIdx.x == 0) s.token_row = b * p.seqlen + where.first_token, s.rows = where.rows;

    // K tile: 64 rows x 16 vectors of 16 bytes; rows past the chunk are zero-filled (from the
    // chunk's first row, a valid address).
    // Thread t copies vectors t + 256 j: rows t / 16 + 16 j, vector t % 16 (unsigned, unrolled: no
    // divisions; rows past the chunk read row 0).
    {
      const int first_row = static_cast<int>(threadIdx.x / 16), vec = static_cast<int>(threadIdx.x % 16);
      const Elem* k_vec = row_ptr<Elem>(p.k, p.k_strides, b, where.first_token, heads.hk) + vec * 8;
#pragma unroll
      for (int j = 0; j < kChunk * 16 / kThreads; ++j) {
        const int row = first_row + j * (kThreads / 16);
        const bool valid = row < where.rows;
        cp_async_16(&s.k[row * kPitchK + vec * 8], k_vec + (valid ? row : 0) * p.k_strides.token, valid);
      }
    }
    cp_async_commit();
    const bool gated = writes_ag(p);
    // The gates too (the forward's calls, the backward's pre-pass): warps 4 and 5, which hold no tile in
    // stage 1, load heads v = warp - 4 and warp - 2's raw words here (fetch_raw_chunk_gates: no use
    // before the barrier, so the loads stay in flight across it) and decode and store them beside
    // stage 1 (store_gates), so that the barrier waits for K alone.
    const bool with_gates = p.chunk_gates != nullptr || gated;
    const bool gate_warp = warp == kFirstGateWarp || warp == kFirstGateWarp + 1;
    RawChunkGates raw_gates[2];
    if (with_gates) {
      if (gate_warp) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (const int v = warp - kFirstGateWarp + 2 * i; v < heads.count)
            raw_gates[i] = fetch_gate_words(p, b, where.first_token, where.rows, heads.first + v);
      }
    } else {  // betas only (0 past the chunk)
      for (int e = threadIdx.x; e < heads.count * kChunk; e += kThreads) {
        const int v = e / kChunk, row = e % kChunk;
        s.beta[v][row] = row < where.rows ? load_beta(p, b, where.first_token + row, heads.first + v) : 0.f;
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    // 1. StrictLower(K K^T), once for the CTA's heads (warps 4 and 5 hold tiles wholly above the
    //    diagonal, which nothing reads: they store the gates meanwhile).
    {
      const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
      static_assert(16 * (kFirstGateWarp % 4) + 15 <= 32 * (kFirstGateWarp / 4) &&
                    16 * ((kFirstGateWarp + 1) % 4) + 15 <= 32 * ((kFirstGateWarp + 1) / 4), "the gate warps hold no tile");
      if (with_gates && gate_warp) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (const int v = warp - kFirstGateWarp + 2 * i; v < heads.count)
            store_gates(p, s, decode_chunk_gates(p, raw_gates[i], where.rows), v, heads.first, gated);
      } else if (m0 + 15 > n0) {
        float acc[1][4][4];
        zero(acc);
        // warp_gemm<1, 4, kRowMajor, kTransposed>'s products in its order, its k loop unrolled: each
        // fragment one ldmatrix at a lane address plus an immediate.
        {
          const int lane = threadIdx.x % 32;
          const Elem* a_lane = s.k + (m0 + lane % 16) * kPitchK + (lane / 16) * 8;
          const Elem* b_lane = s.k + (n0 + lane % 8 + (lane / 16) * 8) * kPitchK + ((lane / 8) % 2) * 8;
#pragma unroll 2
          for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
            uint32_t af[4];
            ldmatrix_x4(af, a_lane + k0);
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
              uint32_t bf[4];
              ldmatrix_x4(bf, b_lane + 8 * j * kPitchK + k0);
              mma_16816<Elem>(acc[0][j], af, bf[0], bf[1]);
              mma_16816<Elem>(acc[0][j + 1], af, bf[2], bf[3]);
            }
          }
        }
        // Per 16-column half (warp-uniform): a block below the diagonal goes to kk as it is (all its
        // entries lie below the diagonal); a diagonal block to kk_diag unmasked (stage 2 reads only its
        // entries below the diagonal) and its diagonal to k_norm2; one above it nowhere. kk's diagonal
        // and upper blocks are never read (the merges read L_{i, kb} for kb < i).
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int block_col = n0 / 16 + half, block_row = m0 / 16;
          if (block_col < block_row) {
#pragma unroll
            for (int j = 2 * half; j < 2 * half + 2; ++j)
#pragma unroll
              for (int e = 0; e < 4; e += 2)
                s.kk.store_pair(acc_row(m0, 0, e), acc_col(n0, j, e), acc[0][j][e], acc[0][j][e + 1]);
          } else if (block_col == block_row) {
#pragma unroll
            for (int j = 2 * half; j < 2 * half + 2; ++j)
#pragma unroll
              for (int e = 0; e < 4; e += 2) {  // the pair (row, col), (row, col + 1)
                const int row = acc_row(m0, 0, e), col = acc_col(n0, j, e);
                *reinterpret_cast<float2*>(&s.kk_diag[block_row][row % 16][col % 16]) =
                    make_float2(acc[0][j][e], acc[0][j][e + 1]);
                if (row == col || row == col + 1) s.k_norm2[row] = row == col ? acc[0][j][e] : acc[0][j][e + 1];
              }
          }
        }
      }
    }
    __syncthreads();  // K is dead from here: X reuses its bytes
    if (p.chunk_window_terms != nullptr && warp < heads.count)
      write_window_term(p, s, warp, heads.first + warp);

    // Per head v: L = diag(beta_v) StrictLower(K K^T), its rows scaled where they are used.
#pragma unroll 1
    for (int v = 0; v < (kOneHead ? 1 : heads.count); ++v) {
      const float* beta = s.beta[v];
      // 2. Diagonal blocks: X_ii[:, c] solves (I + L_ii) x = e_c (warp i / 2, lane 16 (i % 2) + c: all 32
      //    lanes of warps 0 and 1, where one block a warp left half of each warp's issue slots idle).
      if (warp < 2) {
        const int block = 2 * warp + lane / 16, c = lane % 16;
        const float(&kk_ii)[16][16] = s.kk_diag[block];
        const int base = 16 * block;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          float dot = 0.f;
#pragma unroll
          for (int j = 0; j < i; ++j) dot += kk_ii[i][j] * x[j];
          x[i] = (i == c ? 1.f : 0.f) - beta[base + i] * dot;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) s.x.store(base + i, base + c, x[i]);
      }
      __syncthreads();

      // 3. Block rows 1..3: warp w < 2 i owns the 8 columns 8 w .. 8 w + 7 of X_{i, 0:i}; it reads
      //    X rows above block row i and X_ii, which no warp writes in this block row.
      //    Unrolled (i and kb compile-time: the fragments' addresses are a lane base plus immediates); the
      //    warp-uniform guard kb >= w / 2 skips X_{kb, j} = 0 above the block diagonal (kb < j = w / 2).
      //    The fragments' lane offsets (the B one with the warp's columns) are opaque to the compiler, which
      //    would otherwise recompute them at each fragment (at 40 registers).
      int a_lane = MergeTile::a_lane(), b_lane = MergeTile::b_lane() + 8 * warp;
      asm volatile("" : "+r"(a_lane), "+r"(b_lane));
#pragma unroll
      for (int i = 1; i < 4; ++i) {
        const int r0 = 16 * i, n0 = 8 * warp;
        if (warp < 2 * i) {
          float t[4] = {0.f, 0.f, 0.f, 0.f};  // T [16, 8] = L_{i, kb} X_{kb, 8w..} summed over kb
#pragma unroll
          for (int kb = 0; kb < i; ++kb) {
            if (kb < warp / 2) continue;
            typename MergeTile::A kk_block;
            typename MergeTile::B x_block;
            s.kk.a_fragment_at(kk_block, a_lane, r0, 16 * kb);
            s.x.b_fragment_at(x_block, b_lane, 16 * kb, 0);
            mma_merge(t, kk_block, x_block);
          }
          const int row = acc_row(r0, 0, 0), col = acc_col(n0, 0, 0);
          const float beta_row = beta[row], beta_row8 = beta[row + 8];
          t[0] *= beta_row, t[1] *= beta_row, t[2] *= beta_row8, t[3] *= beta_row8;
          typename MergeTile::A x_diag;
          s.x.a_fragment_at(x_diag, a_lane, r0, r0);
          float x_new[4] = {0.f, 0.f, 0.f, 0.f};  // X_ii T, stored negated (sign bits flipped after rounding)
          mma_merge(x_new, x_diag, MergeTile::as_b(t));
          s.x.store_pair_negated(row, col, x_new[0], x_new[1]);
          s.x.store_pair_negated(row + 8, col, x_new[2], x_new[3]);
        }
        __syncthreads();
      }

      const int h = heads.first + v;
      if constexpr (std::is_same_v<InverseT, float>) {
        if (!kSplitMerges && p.inverse_rows_fp16) {
          // the fp16 rows and (the backward) Ag in one pass over X
          if (gated) write_rows<__half, false, Elem>(p.inverse, p.gated_inverse_out, p, s, h, v);
          else write_rows<__half, false>(p.inverse, nullptr, p, s, h, v);
        } else {
          write_fp32_rows(p, s, h);
          if (gated) write_rows<Elem, true>(p.gated_inverse_out, nullptr, p, s, h, v);
        }
      } else if constexpr (std::is_same_v<InverseT, __half>) {
        write_rows<__half, false, Elem>(p.inverse, p.gated_inverse_out, p, s, h, v);
      } else if (gated) {
        write_rows<Elem, true>(p.inverse, nullptr, p, s, h, v);
      } else {
        write_rows<InverseT, false>(p.inverse, nullptr, p, s, h, v);
      }
      if (!kOneHead && v + 1 < heads.count) __syncthreads();  // X read before the next head's stage 2 writes it
    }
  }

  // fetch_raw_chunk_gates' words (the same loads), addressed from the chunk's row 0 of head h: the
  // 64-bit (b, t, h) products once per head, then 64-bit row offsets (two multiply-adds a row).
  static __device__ __forceinline__ RawChunkGates fetch_gate_words(const ForwardParams& p, int64_t b, int64_t t0,
                                                                   int rows, int h) {
    RawChunkGates raw;
    const int lane = threadIdx.x % 32;  // one warp
    const float* g = p.g + (b * p.g_strides.batch + t0 * p.g_strides.token + h * p.g_strides.head);
    const int64_t beta0 = beta_index(p, b, t0, h);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 2 * lane + i, r = row < rows ? row : 0;
      raw.g[i] = g[r * p.g_strides.token];
      const int64_t at = beta0 + r * p.beta_strides.token;
      if (p.beta_is_bf16)
        raw.beta[i] = static_cast<const uint16_t*>(p.beta)[at];
      else
        raw.beta[i] = static_cast<const uint32_t*>(p.beta)[at];
    }
    return raw;
  }

  // One warp: head v's (of the CTA's, from v-head `first`) beta (0 past the chunk) and gcum into shared
  // memory, write_rows' column factors where gated (e = the last token of t's 16-block), and the
  // chunk's gate record where p.chunk_gates is set.
  static __device__ __forceinline__ void store_gates(const ForwardParams& p, SharedStorage& s, const ChunkGates& gates,
                                                     int v, int first, bool gated) {
    const int lane = threadIdx.x % 32;
    store_chunk_gates(s.gcum[v], s.beta[v], gates);
    if (gated) {
      __syncwarp();
#pragma unroll
      for (int t = lane; t < kChunk; t += 32)
        s.col_factor[v][t] = exp2_approx(s.gcum[v][16 * (t / 16) + 15] - s.gcum[v][t]) * s.beta[v][t];
    }
    if (p.chunk_gates != nullptr) {
      float* record = p.chunk_gates + (blockIdx.x * static_cast<int64_t>(p.num_v_heads) + first + v) * 2 * kChunk;
      store_chunk_gates(record, record + kChunk, gates);
    }
  }

  // Warp v: head h's window term of the chunk (ForwardParams::chunk_window_terms), the sum over its
  // valid tokens of g_t + log max(1, |1 - beta_t |k_t|^2|): the gates' sum is gamma (gcum[63], log2
  // units); beta and |k_t|^2 are 0 past the valid rows, where the log is 0.
  static __device__ __forceinline__ void write_window_term(const ForwardParams& p, const SharedStorage& s, int v,
                                                           int h) {
    const int lane = threadIdx.x % 32;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = 2 * lane + i;
      sum += window_growth(s.beta[v][t] * s.k_norm2[t]);
    }
    sum = warp_sum(sum);
    if (lane == 0)
      p.chunk_window_terms[blockIdx.x * static_cast<int64_t>(p.num_v_heads) + h] = chunk_window_term(s.gcum[v][kChunk - 1], sum);
  }

  // The fp32 inverse's rows of valid tokens, row-major in 16-byte vectors (entries above the
  // diagonal blocks, never formed, written as zeros; the block-major order of write_rows spills at
  // this kernel's 64 registers).
  static __device__ __forceinline__ void write_fp32_rows(const ForwardParams& p, const SharedStorage& s, int h) {
    constexpr int kRowVecs = kChunk / 4;
    // The thread's index opaque and the rows' base from shared memory: the loop's terms are formed here,
    // not hoisted out of the head loop (where the backward's default path, the fp16 rows, paid ~50-70
    // instructions a warp for them, and registers through the loop).
    int first = threadIdx.x;
    asm volatile("" : "+r"(first));
    const int rows = s.rows;
    float* out = static_cast<float*>(p.inverse) + (s.token_row * p.num_v_heads + h) * kChunk;
    for (int e = first; e < rows * kRowVecs; e += kThreads) {
      const int row = e / kRowVecs, col0 = (e % kRowVecs) * 4;
      float x[4] = {0.f, 0.f, 0.f, 0.f};
      if (col0 / 16 <= row / 16) s.x.values(row, col0, x);
      store_global_16(out + static_cast<int64_t>(row) * p.num_v_heads * kChunk + col0, __float_as_uint(x[0]),
                      __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3]));
    }
  }

  // The 2-byte inverse's rows of valid tokens into `dst` in 16-byte vectors, block-major: a warp's 32 vectors
  // lie in one 16 x 16 block (block b = 4 R + C of the 4 x 4; its vector i: row 16 R + i / 2,
  // columns 16 C + 8 (i % 2) on), so that all lanes of a warp take one path. Thread t writes vectors t
  // and t + 256: warp w's blocks w and w + 8, the same columns 32 rows apart (one address computation).
  // Blocks above the diagonal (never formed) are written as zeros without reading X. kGated (v4's
  // forward: Ag[s, t] = 2^(gcum_s - gcum_t) X[s, t] beta_t for t <= s, 0 above): on the diagonal blocks
  // per element (masked to t <= s, where the power may overflow); below them the exponent splits at the
  // block column's last token e = 16 C + 15 (t <= e < s): 2^(gcum_s - gcum_e) once per vector times
  // col_factor[t] = 2^(gcum_e - gcum_t) beta_t, both exponents <= 0 (no overflow; a product below
  // fp32's range is 0 either way). Out2 (not void: the fp16 rows of the backward or of the inverse
  // cache, Out = __half unscaled) also writes Ag in Out2 into `dst2` from the same X vector, after the
  // rows (stored first: their words are dead through the gating, which fits the 16-bit kernels'
  // 48 registers so). fp16 rows of the fp16 X tile are copied as they are (the fp32 round trip is exact).
  template <typename Out, bool kGated, typename Out2 = void>
  static __device__ __forceinline__ void write_rows(void* dst, void* dst2, const ForwardParams& p,
                                                    const SharedStorage& s, int h, int v) {
    static_assert(sizeof(Out) == 2, "bf16 / fp16 rows (write_fp32_rows: fp32)");
    constexpr bool kSecond = !std::is_void_v<Out2>;
    static_assert(!kSecond || !kGated, "the second output is the gated one");
    constexpr bool kCopy = !kGated && !kSplitMerges && std::is_same_v<Out, __half>;  // X's fp16 bits as they are
    constexpr int kVecElems = 8;  // per 16-byte vector
    // The thread's index opaque to the compiler and the rows' base read from shared memory (s.token_row):
    // the addresses are recomputed per head instead of being hoisted out of the head loop (live through
    // it, they spilled: the vector's at 48 registers, the rows' base at 40).
    uint32_t tid = threadIdx.x;
    asm volatile("" : "+r"(tid));
    const int rows = s.rows;
    const uint32_t warp = tid / 32, lane = tid % 32;
    const int block_col = static_cast<int>(warp % 4), first_block_row = static_cast<int>(warp / 4);
    const int first_row = 16 * first_block_row + static_cast<int>(lane / 2);
    const int col0 = 16 * block_col + kVecElems * static_cast<int>(lane % 2);
    const int row_stride = p.num_v_heads * kChunk;
    const int64_t rows_base = (s.token_row * p.num_v_heads + h) * kChunk + col0;
    // unrolled, the 16-bit inverse's builds spill at 48 registers
    constexpr int kUnroll = std::is_same_v<InverseT, float> ? 2 : 1;
#pragma unroll kUnroll
    for (int k = 0; k < 2; ++k) {  // blocks w and w + 8: block rows R and R + 2
      const int block_row = first_block_row + 2 * k, row = first_row + 32 * k;
      if (row >= rows) continue;
      const int64_t offset = rows_base + static_cast<int64_t>(row) * row_stride;
      Out* out = static_cast<Out*>(dst) + offset;
      if (block_col > block_row) {
        store_global_16(out, 0u, 0u, 0u, 0u);
        if constexpr (kSecond) store_global_16(static_cast<Out2*>(dst2) + offset, 0u, 0u, 0u, 0u);
        continue;
      }
      uint32_t words[4] = {0u, 0u, 0u, 0u};
      float x[kVecElems];
      if constexpr (kCopy) {
        const uint4 raw = s.x.raw16(row, col0);
        words[0] = raw.x, words[1] = raw.y, words[2] = raw.z, words[3] = raw.w;
        if constexpr (kSecond) s.x.values(row, col0, x);
      } else {
        s.x.values(row, col0, x);
      }
      if constexpr (kSecond) store_global_16(out, words[0], words[1], words[2], words[3]);
      if constexpr (kGated || kSecond) gate_vector(s, v, row, col0, block_row, block_col, x);
      if constexpr (kSecond) {
        uint32_t gated_words[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) gated_words[j] = pack_pair<Out2>(x[2 * j], x[2 * j + 1]);
        store_global_16(static_cast<Out2*>(dst2) + offset, gated_words[0], gated_words[1], gated_words[2],
                        gated_words[3]);
      } else {
        if constexpr (!kCopy) {
#pragma unroll
          for (int j = 0; j < 4; ++j) words[j] = pack_pair<Out>(x[2 * j], x[2 * j + 1]);
        }
        // One st.global.v4 (NVVM split the gated branch's uint4 store into four 4-byte stores).
        store_global_16(out, words[0], words[1], words[2], words[3]);
      }
    }
  }

  // Ag's values of X's vector (row, col0 .. col0 + 7) of block (block_row, block_col), in place (write_rows).
  static __device__ __forceinline__ void gate_vector(const SharedStorage& s, int v, int row, int col0, int block_row,
                                                     int block_col, float (&x)[8]) {
    const float g_row = s.gcum[v][row];
    if (block_col < block_row) {
      const float row_factor = exp2_approx(g_row - s.gcum[v][16 * block_col + 15]);
#pragma unroll
      for (int j = 0; j < 8; j += 4) {
        const float4 c4 = *reinterpret_cast<const float4*>(&s.col_factor[v][col0 + j]);
        x[j] *= row_factor * c4.x, x[j + 1] *= row_factor * c4.y;
        x[j + 2] *= row_factor * c4.z, x[j + 3] *= row_factor * c4.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; j += 4) {
        const float4 g4 = *reinterpret_cast<const float4*>(&s.gcum[v][col0 + j]);
        const float4 b4 = *reinterpret_cast<const float4*>(&s.beta[v][col0 + j]);
        const float g[4] = {g4.x, g4.y, g4.z, g4.w}, be[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
          x[j + u] = col0 + j + u <= row ? exp2_approx(g_row - g[u]) * x[j + u] * be[u] : 0.f;
      }
    }
  }
};

// CTAs per SM (launch bounds): the fp32 inverse 4 (it spills at 48 registers, with either merges); the
// 16-bit one (bf16 rows, or fp16 rows beside Ag) 6 (40 registers) where a CTA takes one v-head, else 5
// (48). Measured on the H200 (session 28, 6 against 5): one head a CTA -3.8% at 1x32768 (16,16) and
// -2.8% at 1x8192 (16,16); four heads a CTA +5..+9% at 1x32768 (2,8) (a longer CTA, 1024 of them: the
// last wave's tail grows).
template <typename InverseT>
constexpr int chunk_inverse_ctas_per_sm(int heads_per_cta) {
  return std::is_same_v<InverseT, float> ? 4 : heads_per_cta == 1 ? 6 : 5;
}
// six CTAs' shared memory (and the driver's 1 KiB each) within a SM's 228 KiB
static_assert(6 * (sizeof(ChunkInverse<__nv_bfloat16, __nv_bfloat16, false>::SharedStorage) + 1024) <= 228 * 1024);

template <typename Elem, typename InverseT, bool kSplitMerges, int kCtasPerSm>
__global__ void __launch_bounds__(256, kCtasPerSm) chunk_inverse_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  // one v-head a CTA: the build that launch_chunk_inverse_kernel launches only where heads == 1
  constexpr bool kOneHead = kCtasPerSm == chunk_inverse_ctas_per_sm<InverseT>(1) &&
                            kCtasPerSm != chunk_inverse_ctas_per_sm<InverseT>(2);
  ChunkInverse<Elem, InverseT, kSplitMerges>::template run<kOneHead>(p);
}

}  // namespace flashgdn::kern
