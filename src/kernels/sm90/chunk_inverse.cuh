// Gate-free chunk inverse:  A_r = (I + StrictLower(diag(beta) K K^T))^{-1}  per (chunk, v-head).
//
// Grid  (max_chunks, Hqk x ceil((Hv / Hqk) / heads per CTA)); block 256 threads (8 warps): one CTA
// per chunk and group of up to 4 v-heads sharing a q/k head (GQA), so K's load and K K^T are done
// once for them (fewer where the grid would have under 2 CTAs a SM: heads_per_cta).
// No gates anywhere (DESIGN §1, gate extraction: the fused kernel re-applies G elementwise).
// Shared memory (34 KiB with fp16 merges, 43 KiB with split ones; 6 or 5 CTAs per SM by registers with the
// 16-bit inverse (chunk_inverse_ctas_per_sm), 4 with the fp32 one): K
// tile [64][136] bf16 (padded rows), sharing its bytes with X = A_r, one fp16 tile [64][72] (warp_mma.cuh
// HalfTile) for fp16 merges, kept split for bf16x3 merges (SplitTile: bf16 hi + lo [64][72] each; the
// fp32 inverse with kSplitMerges, launch.h's InverseMerges); K is dead once K K^T is formed; StrictLower(K K^T) the same way, its diagonal
// blocks also in fp32 [4][16][16]; beta, gcum and the gated write's column factors [4 heads][64].
// Stages (16 x 16 blocks, X_ij for block row i and block column j; L = diag(beta) StrictLower(K K^T),
// its row scaling applied where L is used):
//   1. KK^T        [64,64] = K[64,128] @ K^T[128,64]        (mma.sync, 8 warps x [16,32] tiles; the
//      two tiles wholly above the diagonal are skipped: their warps 4 and 5 store the gates, whose
//      loads they issued before the K tile's barrier), strictly lower part kept; once per CTA
//   then per v-head of the group:
//   2. X_ii = (I + L_ii)^{-1}: warp i < 4, lane c < 16 solves column c by forward substitution in
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
// p.gated_inverse_out (the backward) writes Ag there as well; where p.chunk_gates is set,
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
  };

  // The CTA's v-heads: `count` heads from `first`, all of q/k head hk (blockIdx.y = hk * groups + group,
  // groups of p.inverse_heads_per_cta).
  struct HeadGroup {
    int hk, first, count;
  };
  static __host__ __device__ int groups_per_qk_head(const ForwardParams& p) {
    return (p.num_v_heads / p.num_qk_heads + p.inverse_heads_per_cta - 1) / p.inverse_heads_per_cta;
  }
  static __device__ HeadGroup head_group(const ForwardParams& p) {
    const int per_qk = p.num_v_heads / p.num_qk_heads, groups = groups_per_qk_head(p);
    const int hk = blockIdx.y / groups, first = (blockIdx.y % groups) * p.inverse_heads_per_cta;
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

  static __device__ void run(const ForwardParams& p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const HeadGroup heads = head_group(p);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    ChunkLocation where;
    if (!locate_chunk(p, blockIdx.x, where)) return;
    const int64_t b = where.seq.batch;

    // K tile: 64 rows x 16 vectors of 16 bytes; rows past the chunk are zero-filled (from the
    // chunk's first row, a valid address).
    const Elem* k_chunk = row_ptr<Elem>(p.k, p.k_strides, b, where.first_token, heads.hk);
    for (int e = threadIdx.x; e < kChunk * 16; e += kThreads) {
      const int row = e / 16, vec = e % 16;
      const bool valid = row < where.rows;
      cp_async_16(&s.k[row * kPitchK + vec * 8], k_chunk + (valid ? row : 0) * p.k_strides.token + vec * 8, valid);
    }
    cp_async_commit();
    const bool gated = std::is_same_v<InverseT, float> ? p.gated_inverse_out != nullptr : p.gated_inverse;
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
            raw_gates[i] = fetch_raw_chunk_gates(p, b, where.first_token, where.rows, heads.first + v);
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
        warp_gemm<1, 4, Stored::kRowMajor, Stored::kTransposed>(acc, s.k, kPitchK, s.k, kPitchK, m0, n0, kHeadDim);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {  // the pair (row, col), (row, col + 1)
            const int row = acc_row(m0, 0, e), col = acc_col(n0, j, e);
            const float kk0 = row > col ? acc[0][j][e] : 0.f;
            const float kk1 = row > col + 1 ? acc[0][j][e + 1] : 0.f;
            s.kk.store_pair(row, col, kk0, kk1);
            if (row / 16 == col / 16)
              *reinterpret_cast<float2*>(&s.kk_diag[row / 16][row % 16][col % 16]) = make_float2(kk0, kk1);
            if (row == col || row == col + 1)
              s.k_norm2[row] = row == col ? acc[0][j][e] : acc[0][j][e + 1];
          }
      }
    }
    __syncthreads();  // K is dead from here: X reuses its bytes
    if (p.chunk_window_terms != nullptr && warp < heads.count)
      write_window_term(p, s, warp, heads.first + warp);

    // Per head v: L = diag(beta_v) StrictLower(K K^T), its rows scaled where they are used.
#pragma unroll 1
    for (int v = 0; v < heads.count; ++v) {
      const float* beta = s.beta[v];
      // 2. Diagonal blocks: X_ii[:, c] solves (I + L_ii) x = e_c (warp i, lane c).
      if (warp < 4 && lane < 16) {
        const float(&kk_ii)[16][16] = s.kk_diag[warp];
        const int base = 16 * warp;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          float dot = 0.f;
#pragma unroll
          for (int j = 0; j < i; ++j) dot += kk_ii[i][j] * x[j];
          x[i] = (i == lane ? 1.f : 0.f) - beta[base + i] * dot;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) s.x.store(base + i, base + lane, x[i]);
      }
      __syncthreads();

      // 3. Block rows 1..3: warp w < 2 i owns the 8 columns 8 w .. 8 w + 7 of X_{i, 0:i}; it reads
      //    X rows above block row i and X_ii, which no warp writes in this block row.
#pragma unroll 1
      for (int i = 1; i < 4; ++i) {
        const int r0 = 16 * i, n0 = 8 * warp;
        if (warp < 2 * i) {
          float t[4] = {0.f, 0.f, 0.f, 0.f};  // T [16, 8] = L_{i, kb} X_{kb, 8w..} summed over kb
          for (int kb = warp / 2; kb < i; ++kb) {  // X_{kb, j} = 0 above the block diagonal (kb < j = w / 2)
            typename MergeTile::A kk_block;
            typename MergeTile::B x_block;
            s.kk.a_fragment(kk_block, r0, 16 * kb);
            s.x.b_fragment(x_block, 16 * kb, n0);
            mma_merge(t, kk_block, x_block);
          }
          const int row = acc_row(r0, 0, 0), col = acc_col(n0, 0, 0);
          const float beta_row = beta[row], beta_row8 = beta[row + 8];
          t[0] *= beta_row, t[1] *= beta_row, t[2] *= beta_row8, t[3] *= beta_row8;
          typename MergeTile::A x_diag;
          s.x.a_fragment(x_diag, r0, r0);
          float x_new[4] = {0.f, 0.f, 0.f, 0.f};  // X_ii T, stored negated
          mma_merge(x_new, x_diag, MergeTile::as_b(t));
          s.x.store_pair(row, col, -x_new[0], -x_new[1]);
          s.x.store_pair(row + 8, col, -x_new[2], -x_new[3]);
        }
        __syncthreads();
      }

      const int h = heads.first + v;
      if constexpr (std::is_same_v<InverseT, float>) {
        if (!kSplitMerges && p.inverse_rows_fp16) write_rows<__half, false>(p.inverse, p, s, b, where, h, v);
        else write_fp32_rows(p, s, b, where, h);
        if (gated) write_rows<Elem, true>(p.gated_inverse_out, p, s, b, where, h, v);
      } else if (gated) {
        write_rows<Elem, true>(p.inverse, p, s, b, where, h, v);
      } else {
        write_rows<InverseT, false>(p.inverse, p, s, b, where, h, v);
      }
      if (v + 1 < heads.count) __syncthreads();  // X read before the next head's stage 2 writes it
    }
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
      sum += logf(fmaxf(1.f, fabsf(1.f - s.beta[v][t] * s.k_norm2[t])));
    }
    sum = warp_sum(sum);
    if (lane == 0) p.chunk_window_terms[blockIdx.x * static_cast<int64_t>(p.num_v_heads) + h] = s.gcum[v][kChunk - 1] / kLog2e + sum;
  }

  // The fp32 inverse's rows of valid tokens, row-major in 16-byte vectors (entries above the
  // diagonal blocks, never formed, written as zeros; the block-major order of write_rows spills at
  // this kernel's 64 registers).
  static __device__ __forceinline__ void write_fp32_rows(const ForwardParams& p, const SharedStorage& s, int64_t b,
                                                         const ChunkLocation& where, int h) {
    constexpr int kRowVecs = kChunk / 4;
    float* out = static_cast<float*>(p.inverse) + ((b * p.seqlen + where.first_token) * p.num_v_heads + h) * kChunk;
    for (int e = threadIdx.x; e < where.rows * kRowVecs; e += kThreads) {
      const int row = e / kRowVecs, col0 = (e % kRowVecs) * 4;
      float x[4] = {0.f, 0.f, 0.f, 0.f};
      if (col0 / 16 <= row / 16) s.x.values(row, col0, x);
      store_global_16(out + static_cast<int64_t>(row) * p.num_v_heads * kChunk + col0, __float_as_uint(x[0]),
                      __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3]));
    }
  }

  // The 2-byte inverse's rows of valid tokens into `dst` in 16-byte vectors, block-major: a warp's 32 vectors
  // lie in one 16 x 16 block (block b = 4 R + C of the 4 x 4; its vector i: row 16 R + i / 2,
  // columns 16 C + 8 (i % 2) on), so that all lanes of a warp take one path. Blocks above the
  // diagonal (never formed) are written as zeros without reading X. kGated (v4's forward: Ag[s, t] =
  // 2^(gcum_s - gcum_t) X[s, t] beta_t for t <= s, 0 above): on the diagonal blocks per element
  // (masked to t <= s, where the power may overflow); below them the exponent splits at the block
  // column's last token e = 16 C + 15 (t <= e < s): 2^(gcum_s - gcum_e) once per vector times
  // col_factor[t] = 2^(gcum_e - gcum_t) beta_t, both exponents <= 0 (no overflow; a product below
  // fp32's range is 0 either way).
  template <typename Out, bool kGated>
  static __device__ __forceinline__ void write_rows(void* dst, const ForwardParams& p, const SharedStorage& s,
                                                    int64_t b, const ChunkLocation& where, int h, int v) {
    static_assert(sizeof(Out) == 2, "bf16 / fp16 rows (write_fp32_rows: fp32)");
    constexpr int kVecElems = 8, kBlockVecs = 2;  // per 16-byte vector; per row of a block
    // The thread's first vector, and with the 16-bit inverse (40 registers) the batch entry too, opaque
    // to the compiler: the addresses are recomputed per head instead of being hoisted out of the head
    // loop (live through it, they spill: the vector's at 48 registers, the rows' base at 40). The fp32
    // inverse's build (64 registers) keeps the rows' base: opaque, its backward kernel measured +1%.
    int64_t batch = b;
    int first = threadIdx.x;
    asm volatile("" : "+r"(first));
    if constexpr (!std::is_same_v<InverseT, float>) asm volatile("" : "+l"(batch));
    const int64_t first_row = batch * p.seqlen + where.first_token;
    Out* out = static_cast<Out*>(dst) + (first_row * p.num_v_heads + h) * kChunk;
    for (int e = first; e < 16 * 16 * kBlockVecs; e += kThreads) {
      const int block = e / (16 * kBlockVecs), i = e % (16 * kBlockVecs);
      const int block_row = block / 4, block_col = block % 4;
      const int row = 16 * block_row + i / kBlockVecs, col0 = 16 * block_col + kVecElems * (i % kBlockVecs);
      if (row < where.rows) {
        float x[kVecElems];
        if (block_col > block_row) {
#pragma unroll
          for (int j = 0; j < kVecElems; ++j) x[j] = 0.f;
        } else {
          s.x.values(row, col0, x);
          if constexpr (kGated) {
            const float g_row = s.gcum[v][row];
            if (block_col < block_row) {
              const float row_factor = exp2_approx(g_row - s.gcum[v][16 * block_col + 15]);
#pragma unroll
              for (int j = 0; j < kVecElems; j += 4) {
                const float4 c4 = *reinterpret_cast<const float4*>(&s.col_factor[v][col0 + j]);
                x[j] *= row_factor * c4.x, x[j + 1] *= row_factor * c4.y;
                x[j + 2] *= row_factor * c4.z, x[j + 3] *= row_factor * c4.w;
              }
            } else {
#pragma unroll
              for (int j = 0; j < kVecElems; j += 4) {
                const float4 g4 = *reinterpret_cast<const float4*>(&s.gcum[v][col0 + j]);
                const float4 b4 = *reinterpret_cast<const float4*>(&s.beta[v][col0 + j]);
                const float g[4] = {g4.x, g4.y, g4.z, g4.w}, be[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
                for (int u = 0; u < 4; ++u)
                  x[j + u] = col0 + j + u <= row ? exp2_approx(g_row - g[u]) * x[j + u] * be[u] : 0.f;
              }
            }
          }
        }
        // One st.global.v4 (NVVM split the gated branch's uint4 store into four 4-byte stores).
        uint32_t words[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) words[j] = pack_pair<Out>(x[2 * j], x[2 * j + 1]);
        store_global_16(out + static_cast<int64_t>(row) * p.num_v_heads * kChunk + col0, words[0], words[1], words[2],
                        words[3]);
      }
    }
  }
};

// CTAs per SM (launch bounds): the fp32 inverse 4 (it spills at 48 registers, with either merges); the
// 16-bit one 6 (40 registers) where a CTA takes one v-head, else 5 (48). Measured on the H200 (session
// 28, 6 against 5): one head a CTA -3.8% at 1x32768 (16,16) and -2.8% at 1x8192 (16,16); four heads a
// CTA +5..+9% at 1x32768 (2,8) (a longer CTA, 1024 of them: the last wave's tail grows).
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
  ChunkInverse<Elem, InverseT, kSplitMerges>::run(p);
}

}  // namespace flashgdn::kern
