// Warpgroup tensor-core primitives (sm_90a wgmma.mma_async), as thin PTX wrappers, and the
// 128-byte-swizzled shared-memory tile layout they read. Tested on the GPU by
// tests/gpu_unit/wgmma_test.cu (every operand-major combination against a host GEMM).
//
// Requirements (not checked): panel rows a multiple of 8, tiles 1024-byte aligned (the swizzle
// acts on absolute address bits), MN-major rows * 128 < 256 KiB (the descriptor's 18-bit fields).
//
// Tiles. A bf16/fp16 operand tile is stored as panels of 64 elements (128 bytes) along its
// contiguous dimension; a panel holds `rows` rows of 128 bytes, and each group of 8 rows (a
// 1024-byte atom) is XOR-swizzled in 16-byte units: element (row, col) of a panel is at byte
//     row * 128 + ((col / 8) ^ (row % 8)) * 16 + (col % 8) * 2.
// Panels follow each other (panel p at p * rows * 128 bytes); tiles are 1024-byte aligned.
//   K-major operand (A [M][K] with K contiguous, or B stored as [N][K]): rows = M (or N), panels
//     along K. Descriptor: start = panel(k0 / 64) + (k0 % 64) * 2 bytes, SBO = 1024 (next 8 rows),
//     LBO unused (encoded 1).
//   MN-major operand (A stored as [K][M], B as [K][N], M/N contiguous): rows = K, panels along
//     M/N. Descriptor: start = k0 * 128 bytes into the first panel, LBO = rows * 128 (next panel
//     of 64 M/N elements), SBO = 1024 (next 8 K rows).
// Accumulators of m64nNk16 (fp32, N/2 per thread): thread t of the warpgroup, warp w = t / 32,
// lane l: d[4j + e] at row 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2 — the mma.sync
// m16n8 C layout of warp_mma.cuh repeated over N / 8 column blocks, one 16-row band per warp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern::wg {

enum class Major { kK, kMN };

__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  return static_cast<uint32_t>(row * 128 + (((col >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1));
}

// Byte offset of element (r, c) of a tile whose contiguous dimension is c, `rows` rows per panel.
__device__ __forceinline__ uint32_t tile_offset(int r, int c, int rows) {
  return static_cast<uint32_t>((c >> 6) * rows * 128) + swizzled_offset(r, c & 63);
}

__device__ __forceinline__ uint64_t encode(uint32_t bytes) { return (bytes & 0x3FFFF) >> 4; }

// Byte offset of the 16-wide K slice at k0 in an operand tile (`rows` rows per panel).
template <Major kMajor>
__device__ __forceinline__ uint32_t slice_offset(int k0, int rows) {
  return kMajor == Major::kK ? static_cast<uint32_t>((k0 >> 6) * rows * 128 + (k0 & 63) * 2)
                             : static_cast<uint32_t>(k0 * 128);
}

// Descriptor of the 16-wide K slice starting at k0 of an operand tile at `tile` (shared memory).
// `rows`: rows per panel (M or N for K-major, K for MN-major).
// The start address field is the tile's plus the slice's byte offset / 16, added to the descriptor's
// low word: tiles are 1024-byte aligned and shared memory ends below 256 KiB, so the sum stays inside
// the 14-bit field. The tile's word is common to every k-step of a product, so each further wgmma
// costs one add of an immediate (formed from the slice's address, each took five uniform operations
// in a chain before its wgmma could issue).
template <Major kMajor>
__device__ __forceinline__ uint64_t descriptor(const void* tile, int k0, int rows) {
  const uint32_t lead = kMajor == Major::kK ? 16u : static_cast<uint32_t>(rows * 128);  // LBO (unused for K-major)
  const uint32_t tile_word = static_cast<uint32_t>(encode(smem_addr(tile)) | encode(lead) << 16);
  constexpr uint32_t kHighWord = 1u << 30 | 1024 >> 4;  // bit 62: 128-byte swizzle; SBO 1024 (next 8 rows)
  return uint64_t{kHighWord} << 32 | (tile_word + (slice_offset<kMajor>(k0, rows) >> 4));
}

// descriptor() from the tile's shared address already encoded (tile_word = (address & 0x3FFFF) >> 4,
// formed once outside a loop and advanced by constants): the k-step's descriptor is one add of an
// immediate to it, with no masking chain per tile.
template <Major kMajor>
__device__ __forceinline__ uint64_t descriptor_from_word(uint32_t tile_word, int k0, int rows) {
  const uint32_t lead = kMajor == Major::kK ? 16u : static_cast<uint32_t>(rows * 128);
  constexpr uint32_t kHighWord = 1u << 30 | 1024 >> 4;
  return uint64_t{kHighWord} << 32 |
         (tile_word + (static_cast<uint32_t>(encode(lead)) << 16) + (slice_offset<kMajor>(k0, rows) >> 4));
}

// A product's descriptor at k0 = 0, pinned where the product starts (an empty asm): ptxas neither
// hoists it nor shares it with another product, so it is live for that product only; its k-steps
// are k_step(). For the gradient pass at 255 registers, where descriptor()'s tile words, shared
// across products, stayed live and spilled 20 bytes.
template <Major kMajor>
__device__ __forceinline__ uint64_t pinned_descriptor(const void* tile, int rows) {
  uint64_t desc = descriptor<kMajor>(tile, 0, rows);
  asm volatile("" : "+l"(desc));
  return desc;
}
// descriptor_from_word() at k0 = 0, pinned as pinned_descriptor() is: its k-steps are k_step(), one
// 64-bit add of an immediate each (a descriptor formed per k-step rewrites its constant high word too).
template <Major kMajor>
__device__ __forceinline__ uint64_t pinned_descriptor_from_word(uint32_t tile_word, int rows) {
  uint64_t desc = descriptor_from_word<kMajor>(tile_word, 0, rows);
  asm volatile("" : "+l"(desc));
  return desc;
}
template <Major kMajor>
__device__ __forceinline__ uint64_t k_step(uint64_t desc0, int k0, int rows) {
  return desc0 + (slice_offset<kMajor>(k0, rows) >> 4);
}

// Before the first wgmma of a group, and after any register write an RS wgmma reads as A (PTX:
// registers accessed by wgmma must be fenced from their prior accesses).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Pins accumulator registers in place around fence() / wait() so the compiler moves no access of
// them across the asynchronous window.
template <int kN>
__device__ __forceinline__ void fence_operand(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Generic-proxy writes to shared memory made visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_shared_to_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define FLASHGDN_WG_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define FLASHGDN_WG_ACC8_OPERANDS FLASHGDN_WG_ACC4(0), FLASHGDN_WG_ACC4(4)
#define FLASHGDN_WG_ACC16_OPERANDS \
  FLASHGDN_WG_ACC4(0), FLASHGDN_WG_ACC4(4), FLASHGDN_WG_ACC4(8), FLASHGDN_WG_ACC4(12)
#define FLASHGDN_WG_ACC32_OPERANDS                                                                  \
  FLASHGDN_WG_ACC4(0), FLASHGDN_WG_ACC4(4), FLASHGDN_WG_ACC4(8), FLASHGDN_WG_ACC4(12), FLASHGDN_WG_ACC4(16), \
      FLASHGDN_WG_ACC4(20), FLASHGDN_WG_ACC4(24), FLASHGDN_WG_ACC4(28)
#define FLASHGDN_WG_ACC64_OPERANDS                                                                            \
  FLASHGDN_WG_ACC32_OPERANDS, FLASHGDN_WG_ACC4(32), FLASHGDN_WG_ACC4(36), FLASHGDN_WG_ACC4(40),                 \
      FLASHGDN_WG_ACC4(44), FLASHGDN_WG_ACC4(48), FLASHGDN_WG_ACC4(52), FLASHGDN_WG_ACC4(56), FLASHGDN_WG_ACC4(60)
#define FLASHGDN_WG_ACC8_LIST "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define FLASHGDN_WG_ACC16_LIST "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FLASHGDN_WG_ACC32_LIST                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASHGDN_WG_ACC64_LIST                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "   \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
  "%62, %63}"
// One SS wgmma: SHAPE_TYPES e.g. "m64n128k16.f32.bf16.bf16"; DESC, PRED, TRANS the operand numbers
// after the accumulators.
#define FLASHGDN_WG_SS(SHAPE_TYPES, LIST, OPERANDS, DESC, PRED, TRANS)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                           \
               "wgmma.mma_async.sync.aligned." SHAPE_TYPES " " LIST ", " DESC ", p, 1, 1, " TRANS ";\n}\n" \
               : OPERANDS                                                                                  \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB))

// d[N/2] (+)= A[64,16] @ B[16,N], both from shared memory; Elem bf16 or fp16, N 32, 64 or 128.
// accumulate == false: d = A @ B.
template <typename Elem, int N, Major kMajorA, Major kMajorB>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 32 || N == 64 || N == 128, "m64n32k16, m64n64k16 or m64n128k16");
  constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static_assert(kBF16 || std::is_same_v<Elem, __half>, "bf16 or fp16 operands");
  constexpr int kTransA = kMajorA == Major::kMN ? 1 : 0;
  constexpr int kTransB = kMajorB == Major::kMN ? 1 : 0;
  if constexpr (N == 128 && kBF16) {
    FLASHGDN_WG_SS("m64n128k16.f32.bf16.bf16", FLASHGDN_WG_ACC64_LIST, FLASHGDN_WG_ACC64_OPERANDS, "%64, %65", "%66",
                   "%67, %68");
  } else if constexpr (N == 128) {
    FLASHGDN_WG_SS("m64n128k16.f32.f16.f16", FLASHGDN_WG_ACC64_LIST, FLASHGDN_WG_ACC64_OPERANDS, "%64, %65", "%66",
                   "%67, %68");
  } else if constexpr (N == 64 && kBF16) {
    FLASHGDN_WG_SS("m64n64k16.f32.bf16.bf16", FLASHGDN_WG_ACC32_LIST, FLASHGDN_WG_ACC32_OPERANDS, "%32, %33", "%34",
                   "%35, %36");
  } else if constexpr (N == 64) {
    FLASHGDN_WG_SS("m64n64k16.f32.f16.f16", FLASHGDN_WG_ACC32_LIST, FLASHGDN_WG_ACC32_OPERANDS, "%32, %33", "%34",
                   "%35, %36");
  } else if constexpr (kBF16) {
    FLASHGDN_WG_SS("m64n32k16.f32.bf16.bf16", FLASHGDN_WG_ACC16_LIST, FLASHGDN_WG_ACC16_OPERANDS, "%16, %17", "%18",
                   "%19, %20");
  } else {
    FLASHGDN_WG_SS("m64n32k16.f32.f16.f16", FLASHGDN_WG_ACC16_LIST, FLASHGDN_WG_ACC16_OPERANDS, "%16, %17", "%18",
                   "%19, %20");
  }
}

// d (+)= A @ B over a k extent of kK (a multiple of 16) in wgmma k-steps: A and B are the operand
// tiles (descriptor() with a_rows, b_rows; kPinned: pinned_descriptor() and k_step()), the first step
// overwrites d unless `accumulate`.
template <typename Elem, int N, Major kMajorA, Major kMajorB, int kK, bool kPinned = false>
__device__ __forceinline__ void mma_ss_k(float (&d)[N / 2], const void* a, int a_rows, const void* b, int b_rows,
                                         bool accumulate) {
  static_assert(kK % 16 == 0, "whole k-steps");
  if constexpr (kPinned) {
    const uint64_t a0 = pinned_descriptor<kMajorA>(a, a_rows), b0 = pinned_descriptor<kMajorB>(b, b_rows);
#pragma unroll
    for (int k0 = 0; k0 < kK; k0 += 16)
      mma_ss<Elem, N, kMajorA, kMajorB>(d, k_step<kMajorA>(a0, k0, a_rows), k_step<kMajorB>(b0, k0, b_rows),
                                        accumulate || k0 > 0);
  } else {
#pragma unroll
    for (int k0 = 0; k0 < kK; k0 += 16)
      mma_ss<Elem, N, kMajorA, kMajorB>(d, descriptor<kMajorA>(a, k0, a_rows), descriptor<kMajorB>(b, k0, b_rows),
                                        accumulate || k0 > 0);
  }
}

// One RS wgmma (A from registers): A, DESC, PRED, TRANS the operand numbers after the accumulators.
#define FLASHGDN_WG_RS(SHAPE_TYPES, LIST, OPERANDS, A, DESC, PRED, TRANS)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                           \
               "wgmma.mma_async.sync.aligned." SHAPE_TYPES " " LIST ", " A ", " DESC ", p, 1, 1, " TRANS ";\n}\n" \
               : OPERANDS                                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), \
                 "n"(kTransB))

// An m64nN accumulator's columns as the A operands of N / 16 RS k-steps (mma_rs): the accumulator's
// columns 16 ks .. 16 ks + 15 are, element for element, the m16k16 A fragment of k-step ks; packed
// in Elem pairs.
template <typename Elem, int kSteps>
__device__ __forceinline__ void to_fragments(const float (&acc)[8 * kSteps], uint32_t (&frag)[kSteps][4]) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks)
#pragma unroll
    for (int q = 0; q < 4; ++q) frag[ks][q] = pack_pair<Elem>(acc[8 * ks + 2 * q], acc[8 * ks + 2 * q + 1]);
}

// d[N/2] (+)= A[64,16] @ B[16,N] with A from registers (Elem x2, the mma.sync m16k16 A fragment of
// each warp's 16-row band, warp_mma.cuh) and B from shared memory; Elem bf16 or fp16, N 16, 32, 64
// or 128.
template <typename Elem, int N, Major kMajorB>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "m64n16k16, m64n32k16, m64n64k16 or m64n128k16");
  constexpr bool kBF16 = std::is_same_v<Elem, __nv_bfloat16>;
  static_assert(kBF16 || std::is_same_v<Elem, __half>, "bf16 or fp16 operands");
  constexpr int kTransB = kMajorB == Major::kMN ? 1 : 0;
  if constexpr (N == 128 && kBF16) {
    FLASHGDN_WG_RS("m64n128k16.f32.bf16.bf16", FLASHGDN_WG_ACC64_LIST, FLASHGDN_WG_ACC64_OPERANDS,
                   "{%64, %65, %66, %67}", "%68", "%69", "%70");
  } else if constexpr (N == 128) {
    FLASHGDN_WG_RS("m64n128k16.f32.f16.f16", FLASHGDN_WG_ACC64_LIST, FLASHGDN_WG_ACC64_OPERANDS,
                   "{%64, %65, %66, %67}", "%68", "%69", "%70");
  } else if constexpr (N == 64 && kBF16) {
    FLASHGDN_WG_RS("m64n64k16.f32.bf16.bf16", FLASHGDN_WG_ACC32_LIST, FLASHGDN_WG_ACC32_OPERANDS,
                   "{%32, %33, %34, %35}", "%36", "%37", "%38");
  } else if constexpr (N == 64) {
    FLASHGDN_WG_RS("m64n64k16.f32.f16.f16", FLASHGDN_WG_ACC32_LIST, FLASHGDN_WG_ACC32_OPERANDS,
                   "{%32, %33, %34, %35}", "%36", "%37", "%38");
  } else if constexpr (N == 32 && kBF16) {
    FLASHGDN_WG_RS("m64n32k16.f32.bf16.bf16", FLASHGDN_WG_ACC16_LIST, FLASHGDN_WG_ACC16_OPERANDS,
                   "{%16, %17, %18, %19}", "%20", "%21", "%22");
  } else if constexpr (N == 32) {
    FLASHGDN_WG_RS("m64n32k16.f32.f16.f16", FLASHGDN_WG_ACC16_LIST, FLASHGDN_WG_ACC16_OPERANDS,
                   "{%16, %17, %18, %19}", "%20", "%21", "%22");
  } else if constexpr (kBF16) {
    FLASHGDN_WG_RS("m64n16k16.f32.bf16.bf16", FLASHGDN_WG_ACC8_LIST, FLASHGDN_WG_ACC8_OPERANDS,
                   "{%8, %9, %10, %11}", "%12", "%13", "%14");
  } else {
    FLASHGDN_WG_RS("m64n16k16.f32.f16.f16", FLASHGDN_WG_ACC8_LIST, FLASHGDN_WG_ACC8_OPERANDS,
                   "{%8, %9, %10, %11}", "%12", "%13", "%14");
  }
}

#undef FLASHGDN_WG_ACC4
#undef FLASHGDN_WG_ACC8_OPERANDS
#undef FLASHGDN_WG_ACC16_OPERANDS
#undef FLASHGDN_WG_ACC32_OPERANDS
#undef FLASHGDN_WG_ACC64_OPERANDS
#undef FLASHGDN_WG_ACC8_LIST
#undef FLASHGDN_WG_ACC16_LIST
#undef FLASHGDN_WG_ACC32_LIST
#undef FLASHGDN_WG_ACC64_LIST
#undef FLASHGDN_WG_SS
#undef FLASHGDN_WG_RS

}  // namespace flashgdn::kern::wg
