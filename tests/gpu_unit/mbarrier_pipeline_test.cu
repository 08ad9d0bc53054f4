// GPU unit test of the producer / consumer protocol of the warp-specialized forward
// (src/kernels/sm90/fused_forward_ws.cuh), on its own: 384 threads, warpgroup 0 produces into a
// 2-slot ring, warpgroups 1 and 2 consume and drift apart by uneven delays; mbarriers ready[2] (128 arrivals) and free[2] (256), parities
// (c >> 1) & 1 and ((c - 2) >> 1) & 1, as the kernel uses them (tma.cuh wrappers). Every consumer
// checks every value of every chunk; a wrong parity or count shows as a mismatch or as a hang
// (ctest's timeout). Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/sm90/tma.cuh"
#include "sm90_device.h"

namespace {

namespace tma = flashgdn::kern::tma;

constexpr int kChunks = 1000, kSlotInts = 1024;

struct Shared {
  int slot[2][kSlotInts];
  alignas(8) uint64_t ready[2];
  alignas(8) uint64_t free[2];
};

__device__ void spin(int64_t cycles) {
  const int64_t start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void __launch_bounds__(384, 1) pipeline_kernel(int* mismatches) {
  __shared__ Shared s;
  if (threadIdx.x == 0) tma::init_ring(s.ready, s.free, 128, 256);
  __syncthreads();
  const int role = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  int bad = 0;
  if (role == 0) {
    for (int c = 0; c < kChunks; ++c) {
      const int buf = c & 1;
      if (c >= 2) tma::wait(&s.free[buf], ((c - 2) >> 1) & 1);
      for (int i = threadIdx.x; i < kSlotInts; i += 128) s.slot[buf][i] = c * kSlotInts + i;
      tma::arrive(&s.ready[buf]);
    }
  } else {
    const int group = role - 1;
    for (int c = 0; c < kChunks; ++c) {
      const int buf = c & 1;
      tma::wait(&s.ready[buf], (c >> 1) & 1);
      for (int i = threadIdx.x % 128; i < kSlotInts; i += 128) bad += s.slot[buf][i] != c * kSlotInts + i;
      if ((c + group) % 7 == 0) spin(2000);  // the groups drift apart
      tma::arrive(&s.free[buf]);
    }
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  int* mismatches = nullptr;
  cudaMalloc(&mismatches, sizeof(int));
  cudaMemset(mismatches, 0, sizeof(int));
  pipeline_kernel<<<132, 384>>>(mismatches);
  int host = -1;
  const cudaError_t err = cudaDeviceSynchronize();
  cudaMemcpy(&host, mismatches, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(mismatches);
  std::printf("mbarrier pipeline, %d chunks x 132 CTAs: %s, %d mismatched values\n", kChunks,
              err == cudaSuccess ? "completed" : cudaGetErrorString(err), host);
  return err == cudaSuccess && host == 0 ? 0 : 1;
}
