// Tensor-memory-accelerator loads and the mbarriers that track them (sm_90), as thin PTX wrappers.
// A 2-D tile load (cp.async.bulk.tensor) writes a box of a global tensor into shared memory in the
// layout its tensor map asks for (with CU_TENSOR_MAP_SWIZZLE_128B: the panel layout of wgmma.cuh,
// one 64-element panel per box) and signals an mbarrier with the bytes it wrote; rows or columns
// outside the tensor arrive as zeros. Host side: tensor_map.h. Tested by tests/gpu_unit/tma_test.cu.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern::tma {

__device__ __forceinline__ void barrier_init(uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(barrier)), "r"(arrivals) : "memory");
}
// Barrier initialisation made visible to the async proxy (before any TMA names the barrier).
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` of transactions the phase waits for.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(barrier)), "r"(bytes)
               : "memory");
}

// The barriers of a 2-slot producer / consumer ring (one thread; a CTA barrier before any use):
// ready[i] completes a phase when `producers` threads have arrived (slot i filled), free[i] when
// `consumers` have (slot i read).
__device__ __forceinline__ void init_ring(uint64_t (&ready)[2], uint64_t (&free)[2], int producers, int consumers) {
  for (int i = 0; i < 2; ++i) {
    barrier_init(&ready[i], producers);
    barrier_init(&free[i], consumers);
  }
  fence_barrier_init();
}

// One plain arrival (release: this thread's earlier shared-memory writes are visible to a thread
// whose wait sees the phase complete).
__device__ __forceinline__ void arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(barrier)) : "memory");
}

// Blocks until the barrier's phase with parity `phase` has completed.
__device__ __forceinline__ void wait(uint64_t* barrier, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(barrier)),
      "r"(phase)
      : "memory");
}

// Whether the barrier's phase with parity `phase` has completed (one test, no waiting).
__device__ __forceinline__ bool test_wait(uint64_t* barrier, uint32_t phase) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(barrier)), "r"(phase)
      : "memory");
  return done != 0;
}

// Byte offset of element (row, col) in a [rows][32] fp32 panel as a 128-byte-swizzled box with a
// 128-byte inner extent lands (1024-byte-aligned destination): 16-byte unit u of row r at unit
// u ^ (r % 8). A pair (col even) stays in its unit.
__host__ __device__ __forceinline__ int fp32_panel_offset(int row, int col) {
  return row * 128 + (((col / 4) ^ (row % 8)) * 16) + (col % 4) * 4;
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) of contiguous global memory into `dst`.
__device__ __forceinline__ void load_bulk(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(barrier))
               : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) of shared memory to contiguous global
// memory, in this thread's current bulk group (commit_bulk closes it). The shared memory's earlier
// generic writes need fence.proxy.async (wg::fence_shared_to_async) and a barrier before this.
__device__ __forceinline__ void store_bulk(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void commit_bulk() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most kPending of this thread's bulk groups have not read their shared memory (it may be
// rewritten) / have not completed their global writes (visible to later loads, TMA included).
template <int kPending>
__device__ __forceinline__ void wait_bulk_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void wait_bulk() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The descriptor `map` fetched ahead of its first load (its fetch otherwise waits inside that load).
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Box at element coordinates (inner, outer) of the tensor described by `map` into `dst`.
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, uint64_t* barrier, int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(barrier)), "r"(inner), "r"(outer)
      : "memory");
}

// The box at element coordinates (inner, outer) of a 2-D tensor map from `src` (shared memory) to global
// memory, as store_4d.
__device__ __forceinline__ void store_2d(const CUtensorMap* map, const void* src, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(inner), "r"(outer)
               : "memory");
}

// The box at element coordinates (c0 innermost, .., c3) of a 4-D tensor map from `src` (shared memory)
// to global memory, in this thread's current bulk group (commit_bulk closes it; wait_bulk_read before
// `src` is rewritten). The box's earlier generic writes need fence.proxy.async and a barrier first.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Box at element coordinates (c0 innermost, .., c3) of a 4-D tensor map into `dst`.
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, uint64_t* barrier, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(barrier)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

}  // namespace flashgdn::kern::tma
