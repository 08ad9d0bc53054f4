// GPU unit test of the TMA primitives (src/kernels/sm90/tma.cuh, tensor_map.h): two 64 x 64 boxes
// of a [100][192] bf16 tensor loaded through one mbarrier land in shared memory exactly in the
// swizzled panel layout that wgmma.cuh's descriptors read (wg::tile_offset), and the rows past the
// tensor's end arrive as zeros. Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/sm90/tensor_map.h"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"
#include "sm90_device.h"

namespace {

namespace tma = flashgdn::kern::tma;
namespace wg = flashgdn::kern::wg;

constexpr int kRows = 100, kCols = 192, kBox = 64;
constexpr int kBoxBytes = kBox * kBox * 2;

__global__ void load_kernel(const __grid_constant__ CUtensorMap map, const uint16_t* global, int* mismatches) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t barrier;
  if (threadIdx.x == 0) {
    tma::barrier_init(&barrier, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::arrive_expect_bytes(&barrier, 2 * kBoxBytes);
    tma::load_2d(smem, &map, &barrier, 64, 0);               // rows 0-63, columns 64-127
    tma::load_2d(smem + kBoxBytes, &map, &barrier, 128, 64);  // rows 64-127 (100-127 outside), columns 128-191
  }
  tma::wait(&barrier, 0);
  int bad = 0;
  for (int e = threadIdx.x; e < 2 * kBox * kBox; e += blockDim.x) {
    const int box = e / (kBox * kBox), r = (e / kBox) % kBox, c = e % kBox;
    const int row = box == 0 ? r : 64 + r, col = box == 0 ? 64 + c : 128 + c;
    const uint16_t want = row < kRows ? global[row * kCols + col] : 0;
    const uint16_t got = *reinterpret_cast<const uint16_t*>(smem + box * kBoxBytes + wg::tile_offset(r, c, kBox));
    bad += got != want;
  }
  atomicAdd(mismatches, bad);
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  std::vector<uint16_t> host(kRows * kCols);
  for (int i = 0; i < kRows * kCols; ++i) host[i] = static_cast<uint16_t>(1 + i);  // distinct, non-zero
  uint16_t* global = nullptr;
  int* mismatches = nullptr;
  cudaMalloc(&global, host.size() * 2);
  cudaMalloc(&mismatches, sizeof(int));
  cudaMemcpy(global, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(mismatches, 0, sizeof(int));
  CUtensorMap map;
  if (CUresult r = flashgdn::kern::encode_panel_map(&map, global, kRows, kCols, kCols * 2, kBox, false);
      r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    return 1;
  }
  cudaFuncSetAttribute(load_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kBoxBytes);
  load_kernel<<<1, 128, 2 * kBoxBytes>>>(map, global, mismatches);
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  int bad = -1;
  cudaMemcpy(&bad, mismatches, sizeof(int), cudaMemcpyDeviceToHost);
  std::printf("TMA 2 boxes of 64 x 64 (128B swizzle, zero fill past row %d): %d mismatching elements: %s\n", kRows,
              bad, bad == 0 ? "ok" : "FAIL");
  cudaFree(global);
  cudaFree(mismatches);
  return bad == 0 ? 0 : 1;
}
