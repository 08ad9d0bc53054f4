// Warp-level tensor-core primitives (sm_80+ mma.sync, ldmatrix, cp.async), as thin PTX wrappers.
//
// Fragment layouts of mma.m16n8k16 (lane = threadIdx.x % 32, r = lane / 4, c = 2 * (lane % 4)):
//   A (16x16, row-major)  a[0]: (r, c..c+1)   a[1]: (r+8, c..c+1)   a[2]: (r, c+8..)   a[3]: (r+8, c+8..)
//   B (16x8, "col")       b[0]: (k=c..c+1, n=r)   b[1]: (k=c+8.., n=r)
//   C (16x8, fp32)        c[0..1]: (r, c..c+1)   c[2..3]: (r+8, c..c+1)
// Operands live in shared memory as row-major bf16/fp16 tiles with a padded row pitch (in
// elements) so that the 8 rows an ldmatrix reads fall in distinct 16-byte bank groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

namespace flashgdn::kern {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane L supplies the row address of matrix L / 8, row L % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_ptr)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_ptr)));
}
// Two 8x8 b16 matrices, transposed; lanes 0-15 supply the row addresses (matrix L / 8, row L % 8;
// the other lanes' addresses are not read but must be valid shared-memory addresses).
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row_ptr)));
}

// The inverse of ldmatrix_x4 (sm_90): four 8x8 b16 matrices to shared memory; lane L supplies the
// row address of matrix L / 8, row L % 8, and register i holds the thread's pair of matrix i (row
// lane / 4, columns 2 (lane % 4) and + 1: the mma C-fragment layout of one 8x8 block).
__device__ __forceinline__ void stmatrix_x4(void* row_ptr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row_ptr)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// stmatrix_x4 with each matrix transposed: lane L's address is row L % 8 of stored matrix L / 8,
// which receives column L % 8 of the register fragments (a tile stored as its transpose).
__device__ __forceinline__ void stmatrix_x4_trans(void* row_ptr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row_ptr)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "bf16 or fp16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// How an operand tile is stored in shared memory, relative to the GEMM's view of it.
//   kRowMajor:  A[m][k] (or B[k][n]) stored with rows m (or k) -> address row*pitch + col
//   kTransposed: A[m][k] stored as Src[k][m] (or B[k][n] stored as Src[n][k])
enum class Stored { kRowMajor, kTransposed };

// A fragment of the 16x16 block of A at (m0, k0).
template <Stored kStore, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* base, int pitch, int m0, int k0) {
  const int lane = threadIdx.x % 32;
  if constexpr (kStore == Stored::kRowMajor) {
    ldmatrix_x4(a, base + (m0 + lane % 16) * pitch + k0 + (lane / 16) * 8);
  } else {
    ldmatrix_x4_trans(a, base + (k0 + lane % 8 + (lane / 16) * 8) * pitch + m0 + ((lane / 8) % 2) * 8);
  }
}

// B fragments of two adjacent 16x8 blocks of B at (k0, n0) and (k0, n0 + 8):
// b[0], b[1] for the first, b[2], b[3] for the second.
template <Stored kStore, typename T>
__device__ __forceinline__ void load_b_pair(uint32_t (&b)[4], const T* base, int pitch, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  if constexpr (kStore == Stored::kRowMajor) {
    ldmatrix_x4_trans(b, base + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * pitch + n0 + (lane / 16) * 8);
  } else {
    ldmatrix_x4(b, base + (n0 + lane % 8 + (lane / 16) * 8) * pitch + k0 + ((lane / 8) % 2) * 8);
  }
}

// acc[MT][NT][4] += A[m0 : m0+16*MT, 0:K] @ B[0:K, n0 : n0+8*NT], K a multiple of 16, NT even.
template <int MT, int NT, Stored kStoreA, Stored kStoreB, typename T>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const T* a, int pitch_a,
                                          const T* b, int pitch_b, int m0, int n0, int K) {
  static_assert(NT % 2 == 0, "B fragments come in pairs");
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) load_a<kStoreA>(af[i], a, pitch_a, m0 + 16 * i, k0);
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
      uint32_t bf[4];
      load_b_pair<kStoreB>(bf, b, pitch_b, k0, n0 + 8 * j);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        mma_16816<T>(acc[i][j], af[i], bf[0], bf[1]);
        mma_16816<T>(acc[i][j + 1], af[i], bf[2], bf[3]);
      }
    }
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// Row / column of accumulator element e of tile (i, j) for a warp tile at (m0, n0).
__device__ __forceinline__ int acc_row(int m0, int i, int e) {
  return m0 + 16 * i + (threadIdx.x % 32) / 4 + (e >= 2 ? 8 : 0);
}
__device__ __forceinline__ int acc_col(int n0, int j, int e) {
  return n0 + 8 * j + 2 * (threadIdx.x % 4) + (e & 1);
}

template <typename T>
__device__ __forceinline__ T to_elem(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 to_elem<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half to_elem<__half>(float x) { return __float2half_rn(x); }

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }

// Two adjacent elements packed for one 32-bit shared-memory store.
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float x0, float x1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x0, x1);
  } else {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x0, x1);
  }
}

// Two adjacent elements packed into one 32-bit register (the low half holds x0).
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float x0, float x1) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(x0, x1);
    bits = *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(x0, x1);
    bits = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return bits;
}

// The two elements of pack_pair's register, back in fp32 (x = the low half).
template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits) {
  if constexpr (std::is_same_v<T, __half>)
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  else
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}
// One 16-byte global store (st.global.v4): for values NVVM would otherwise store word by word.
__device__ __forceinline__ void store_global_16(void* dst, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w0), "r"(w1), "r"(w2), "r"(w3)
               : "memory");
}
// One 8-byte global store (st.global.v2), likewise.
__device__ __forceinline__ void store_global_8(void* dst, float x, float y) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
}

// fp32 products on bf16 tensor cores ("bf16x3"): every fp32 operand x is split as x = hi + lo with
// hi = bf16(x), lo = bf16(x - hi), and A B ~ A_hi B_hi + A_hi B_lo + A_lo B_hi with fp32
// accumulation: about 2^-16 relative error per product (the dropped lo.lo term and lo's rounding),
// against 2^-8 for a plain bf16 product. Operands are fp32 in shared memory with any strides.
struct SplitA {  // the m16n8k16 A fragment, hi and lo parts
  uint32_t hi[4], lo[4];
};
struct SplitB {  // one 16x8 B fragment, hi and lo parts
  uint32_t hi[2], lo[2];
};

// hi's two halves back in fp32 are its bits shifted (x0's, the low half) and masked (x1's): one
// integer operation each (__low2float / __high2float compiled to extract-and-repack PRMTs besides:
// 8 instructions a pair instead of 6).
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  const __nv_bfloat162 l =
      __floats2bfloat162_rn(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Two fp32 elements at `at` and `at + stride` (one 8-byte load when they are adjacent).
template <int kStride>
__device__ __forceinline__ void load_split_pair(const float* at, int stride, uint32_t& hi, uint32_t& lo) {
  if constexpr (kStride == 1) {
    const float2 pair = *reinterpret_cast<const float2*>(at);
    split_pair(pair.x, pair.y, hi, lo);
  } else {
    split_pair(at[0], at[stride], hi, lo);
  }
}

// The fragment of the 16x16 block of A at a (fp32, Stored as in warp_gemm, row pitch in floats;
// kRowMajor rows need 8-byte alignment).
template <Stored kStore>
__device__ __forceinline__ void load_split_a(SplitA& f, const float* a, int pitch) {
  const int lane = threadIdx.x % 32, r = lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // a[q]: row m = r (+8 for q odd), columns k = c, c + 1 (+8 for q >= 2)
    const int m = r + 8 * (q % 2), k = c + 8 * (q / 2);
    if constexpr (kStore == Stored::kRowMajor) {
      load_split_pair<1>(a + m * pitch + k, 1, f.hi[q], f.lo[q]);
    } else {
      load_split_pair<0>(a + k * pitch + m, pitch, f.hi[q], f.lo[q]);
    }
  }
}

// The fragment of the 16x8 block of B at b (fp32, Stored as in warp_gemm, row pitch in floats;
// kTransposed rows need 8-byte alignment).
template <Stored kStore>
__device__ __forceinline__ void load_split_b(SplitB& f, const float* b, int pitch) {
  const int lane = threadIdx.x % 32, r = lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // b[q]: rows k = c, c + 1 (+8 for q = 1), column n = r
    const int k = c + 8 * q, n = r;
    if constexpr (kStore == Stored::kRowMajor) {
      load_split_pair<0>(b + k * pitch + n, pitch, f.hi[q], f.lo[q]);
    } else {
      load_split_pair<1>(b + n * pitch + k, 1, f.hi[q], f.lo[q]);
    }
  }
}

// acc [16,8] (C fragment) += A [16,16] @ B [16,8] in bf16x3.
__device__ __forceinline__ void mma_bf16x3(float (&acc)[4], const SplitA& a, const SplitB& b) {
  mma_16816<__nv_bfloat16>(acc, a.hi, b.hi[0], b.hi[1]);
  mma_16816<__nv_bfloat16>(acc, a.hi, b.lo[0], b.lo[1]);
  mma_16816<__nv_bfloat16>(acc, a.lo, b.hi[0], b.hi[1]);
}

// An 8x8 b16 matrix transposed in registers: lane L holds the pair (row L / 4, columns 2 (L % 4),
// + 1) of the ldmatrix / mma fragment layout, before and after.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The [16,8] fp32 accumulator of an m16n8 product, split, as the B fragment of a next product
// whose k runs over the accumulator's rows: C's pairs (row r, columns 2c, 2c + 1) transposed by
// movmatrix into B's pairs (rows k = 2c, 2c + 1, column n = r); no shared memory.
__device__ __forceinline__ SplitB accumulator_as_b(const float (&acc)[4]) {
  SplitB f;
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // q = 1: accumulator rows 8-15, B's k = 8..15
    uint32_t hi, lo;
    split_pair(acc[2 * q], acc[2 * q + 1], hi, lo);
    f.hi[q] = movmatrix_trans(hi);
    f.lo[q] = movmatrix_trans(lo);
  }
  return f;
}

// fp32 values kept in shared memory already split for bf16x3, as a bf16 hi and a bf16 lo tile
// [kRows][kPitch] (row-major), so that products read ready fragments by ldmatrix instead of
// splitting fp32 at every load. A value reads back as hi + lo (relative error <= 2^-17). kPitch is
// 8 times an odd number: the 8 rows an ldmatrix reads fall in distinct 16-byte bank groups.
template <int kRows, int kPitch>
struct SplitTile {
  static_assert(kPitch % 8 == 0 && (kPitch / 8) % 2 == 1, "rows 16-byte aligned, an odd number of 16-byte units");
  using A = SplitA;  // its fragments, for mma_merge
  using B = SplitB;
  alignas(16) __nv_bfloat16 hi[kRows * kPitch];
  alignas(16) __nv_bfloat16 lo[kRows * kPitch];

  __device__ __forceinline__ void store(int row, int col, float x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    hi[row * kPitch + col] = h;
    lo[row * kPitch + col] = __float2bfloat16_rn(x - __bfloat162float(h));
  }
  // (row, col) and (row, col + 1), col even.
  __device__ __forceinline__ void store_pair(int row, int col, float x0, float x1) {
    uint32_t h, l;
    split_pair(x0, x1, h, l);
    *reinterpret_cast<uint32_t*>(&hi[row * kPitch + col]) = h;
    *reinterpret_cast<uint32_t*>(&lo[row * kPitch + col]) = l;
  }
  // store_pair(row, col, -x0, -x1) bit for bit: the split of -x is (-hi, -lo), its sign bits flipped.
  __device__ __forceinline__ void store_pair_negated(int row, int col, float x0, float x1) {
    uint32_t h, l;
    split_pair(x0, x1, h, l);
    *reinterpret_cast<uint32_t*>(&hi[row * kPitch + col]) = h ^ 0x80008000u;
    *reinterpret_cast<uint32_t*>(&lo[row * kPitch + col]) = l ^ 0x80008000u;
  }
  __device__ __forceinline__ float value(int row, int col) const {
    return __bfloat162float(hi[row * kPitch + col]) + __bfloat162float(lo[row * kPitch + col]);
  }
  // kCount = 4 or 8 values from (row, col) on, col a multiple of kCount: one vector read per part.
  template <int kCount>
  __device__ __forceinline__ void values(int row, int col, float (&x)[kCount]) const {
    static_assert(kCount == 4 || kCount == 8, "8- or 16-byte vectors");
    using Vector = std::conditional_t<kCount == 4, uint2, uint4>;
    const Vector h = *reinterpret_cast<const Vector*>(&hi[row * kPitch + col]);
    const Vector l = *reinterpret_cast<const Vector*>(&lo[row * kPitch + col]);
    const __nv_bfloat162* hp = reinterpret_cast<const __nv_bfloat162*>(&h);
    const __nv_bfloat162* lp = reinterpret_cast<const __nv_bfloat162*>(&l);
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) {
      const float2 a = __bfloat1622float2(hp[i]), b = __bfloat1622float2(lp[i]);
      x[2 * i] = a.x + b.x;
      x[2 * i + 1] = a.y + b.y;
    }
  }
  // The A fragment of the 16x16 block at (m0, k0).
  __device__ __forceinline__ void a_fragment(SplitA& f, int m0, int k0) const {
    load_a<Stored::kRowMajor>(f.hi, hi, kPitch, m0, k0);
    load_a<Stored::kRowMajor>(f.lo, lo, kPitch, m0, k0);
  }
  // The B fragment of the 16x8 block at (k0, n0): one ldmatrix.x4.trans, matrices hi k0.., hi
  // k0 + 8.., lo k0.., lo k0 + 8.. (lane L gives a row of matrix L / 8).
  __device__ __forceinline__ void b_fragment(SplitB& f, int k0, int n0) const {
    const int lane = threadIdx.x % 32, m = lane / 8;
    uint32_t r[4];
    ldmatrix_x4_trans(r, (m < 2 ? hi : lo) + (k0 + 8 * (m % 2) + lane % 8) * kPitch + n0);
    f.hi[0] = r[0], f.hi[1] = r[1], f.lo[0] = r[2], f.lo[1] = r[3];
  }
  static __device__ __forceinline__ B as_b(const float (&acc)[4]) { return accumulator_as_b(acc); }
  // The fragments' lane offsets (elements from hi), computed once so that a fragment at a compile-time
  // block is one ldmatrix at a register plus an immediate (a_fragment_at, b_fragment_at).
  static __device__ __forceinline__ int a_lane() {
    const int lane = threadIdx.x % 32;
    return (lane % 16) * kPitch + (lane / 16) * 8;
  }
  static __device__ __forceinline__ int b_lane() {  // matrices hi k0.., hi k0 + 8.., lo k0.., lo k0 + 8..
    const int lane = threadIdx.x % 32, m = lane / 8;
    return (m < 2 ? 0 : kRows * kPitch) + (8 * (m % 2) + lane % 8) * kPitch;
  }
  __device__ __forceinline__ void a_fragment_at(SplitA& f, int a_lane, int m0, int k0) const {
    ldmatrix_x4(f.hi, hi + a_lane + m0 * kPitch + k0);
    ldmatrix_x4(f.lo, lo + a_lane + m0 * kPitch + k0);
  }
  __device__ __forceinline__ void b_fragment_at(SplitB& f, int b_lane, int k0, int n0) const {
    uint32_t r[4];
    ldmatrix_x4_trans(r, reinterpret_cast<const __nv_bfloat16*>(this) + b_lane + k0 * kPitch + n0);
    f.hi[0] = r[0], f.hi[1] = r[1], f.lo[0] = r[2], f.lo[1] = r[3];
  }
};

// The same products in plain fp16 (one mma a product, fp32 accumulation; operands rounded to fp16's
// 11 bits): where the operands' range is known to fit fp16 and their result is stored in 16 bits
// anyway (the bf16 chunk inverses, v5's and chunk_inverse's: bench/forward_precision puts the forward's o within 1.3% of
// bf16x3's error in every regime).
struct Fp16A {  // the m16n8k16 A fragment
  uint32_t v[4];
};
struct Fp16B {  // one 16x8 B fragment
  uint32_t v[2];
};
__device__ __forceinline__ void mma_merge(float (&acc)[4], const Fp16A& a, const Fp16B& b) {
  mma_16816<__half>(acc, a.v, b.v[0], b.v[1]);
}
__device__ __forceinline__ void mma_merge(float (&acc)[4], const SplitA& a, const SplitB& b) { mma_bf16x3(acc, a, b); }

// A [kRows][kPitch] fp16 tile (row-major), SplitTile's interface with one part.
template <int kRows, int kPitch>
struct HalfTile {
  static_assert(kPitch % 8 == 0 && (kPitch / 8) % 2 == 1, "rows 16-byte aligned, an odd number of 16-byte units");
  using A = Fp16A;
  using B = Fp16B;
  alignas(16) __half v[kRows * kPitch];

  __device__ __forceinline__ void store(int row, int col, float x) { v[row * kPitch + col] = __float2half_rn(x); }
  // (row, col) and (row, col + 1), col even.
  __device__ __forceinline__ void store_pair(int row, int col, float x0, float x1) {
    *reinterpret_cast<__half2*>(&v[row * kPitch + col]) = __floats2half2_rn(x0, x1);
  }
  // store_pair(row, col, -x0, -x1) bit for bit (fp16 rounding is sign-symmetric): one sign-bit flip
  // of the packed pair instead of two negations.
  __device__ __forceinline__ void store_pair_negated(int row, int col, float x0, float x1) {
    const __half2 pair = __floats2half2_rn(x0, x1);
    *reinterpret_cast<uint32_t*>(&v[row * kPitch + col]) = *reinterpret_cast<const uint32_t*>(&pair) ^ 0x80008000u;
  }
  // kCount = 4 or 8 values from (row, col) on, col a multiple of kCount: one vector read.
  template <int kCount>
  __device__ __forceinline__ void values(int row, int col, float (&x)[kCount]) const {
    static_assert(kCount == 4 || kCount == 8, "8- or 16-byte vectors");
    using Vector = std::conditional_t<kCount == 4, uint2, uint4>;
    const Vector raw = *reinterpret_cast<const Vector*>(&v[row * kPitch + col]);
    const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) {
      const float2 pair = __half22float2(pairs[i]);
      x[2 * i] = pair.x;
      x[2 * i + 1] = pair.y;
    }
  }
  // The 8 fp16 values from (row, col) on (col a multiple of 8) as they are stored: one 16-byte read.
  __device__ __forceinline__ uint4 raw16(int row, int col) const {
    return *reinterpret_cast<const uint4*>(&v[row * kPitch + col]);
  }
  // The A fragment of the 16x16 block at (m0, k0).
  __device__ __forceinline__ void a_fragment(A& f, int m0, int k0) const {
    load_a<Stored::kRowMajor>(f.v, v, kPitch, m0, k0);
  }
  // The B fragment of the 16x8 block at (k0, n0): rows k0 .. k0 + 15 by one ldmatrix.x2.trans.
  __device__ __forceinline__ void b_fragment(B& f, int k0, int n0) const {
    ldmatrix_x2_trans(f.v, v + (k0 + threadIdx.x % 16) * kPitch + n0);
  }
  // The fragments' lane offsets, as SplitTile's.
  static __device__ __forceinline__ int a_lane() {
    const int lane = threadIdx.x % 32;
    return (lane % 16) * kPitch + (lane / 16) * 8;
  }
  static __device__ __forceinline__ int b_lane() { return (threadIdx.x % 16) * kPitch; }
  __device__ __forceinline__ void a_fragment_at(A& f, int a_lane, int m0, int k0) const {
    ldmatrix_x4(f.v, v + a_lane + m0 * kPitch + k0);
  }
  __device__ __forceinline__ void b_fragment_at(B& f, int b_lane, int k0, int n0) const {
    ldmatrix_x2_trans(f.v, v + b_lane + k0 * kPitch + n0);
  }
  // A [16,8] fp32 accumulator as the B fragment of a next product whose k runs over its rows: C's
  // pairs (row r, columns 2c, 2c + 1) transposed by movmatrix into B's (rows k = 2c, 2c + 1, column
  // n = r); no shared memory.
  static __device__ __forceinline__ B as_b(const float (&acc)[4]) {
    B f;
#pragma unroll
    for (int q = 0; q < 2; ++q) {  // q = 1: accumulator rows 8-15, B's k = 8..15
      const __half2 pair = __floats2half2_rn(acc[2 * q], acc[2 * q + 1]);
      f.v[q] = movmatrix_trans(*reinterpret_cast<const uint32_t*>(&pair));
    }
    return f;
  }
};

// 2^x by the special-function unit (max relative error about 2^-22; subnormal results flush to
// zero). Gates are kept in log2 units so that every decay factor is one ex2 of a non-positive
// argument.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
inline constexpr float kLog2e = 1.4426950408889634f;

// Sum across the 32 lanes of a warp, in every lane (butterfly).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Inclusive prefix sum across the 32 lanes of a warp: lane i gets x_0 + ... + x_i.
__device__ __forceinline__ float warp_inclusive_sum(float x) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const float up = __shfl_up_sync(0xffffffffu, x, offset);
    if (lane >= offset) x += up;
  }
  return x;
}

// 16-byte asynchronous global -> shared copy (cp.async.cg), with zero fill when !valid.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace flashgdn::kern
