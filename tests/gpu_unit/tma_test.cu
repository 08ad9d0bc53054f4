// GPU unit test of the TMA primitives (src/kernels/sm90/tma.cuh, tensor_map.h): two 64 x 64 boxes
// of a [100][192] bf16 tensor loaded through one mbarrier land in shared memory exactly in the
// swizzled panel layout that wgmma.cuh's descriptors read (wg::tile_offset), and the rows past the
// tensor's end arrive as zeros. Then the 4-D token maps of the fused forward (encode_token_map,
// load_4d): boxes of 64 tokens x 64 columns of one head and batch row of a (2, 100, 3, 128) tensor
// with padded strides, tokens past the end as zeros, and a map whose extent-1 head and batch
// dimensions carry strides TMA could not take (they are never stepped). Then the fp32 block maps of
// the CP chains (encode_block_map): from a workspace of three [128][128] fp32 blocks, block 2's four
// column panels and block 1's columns 64..95 land as [128][32] panels where tma::fp32_panel_offset
// says.
// Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
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

// Thread 0 sets up `barrier` for one arrival (plus the loads' bytes), visible to the TMA unit; the
// block waits for it.
__device__ void init_barrier(uint64_t* barrier) {
  if (threadIdx.x == 0) {
    tma::barrier_init(barrier, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
}

__global__ void load_kernel(const __grid_constant__ CUtensorMap map, const uint16_t* global, int* mismatches) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t barrier;
  init_barrier(&barrier);
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

struct TokenBox {
  int col, head, token, batch;
};
struct TokenTensor {  // element strides; tokens: the extent past which the box reads zeros
  int64_t batch_stride, token_stride, head_stride;
  int tokens;
};

__global__ void load_token_box(const __grid_constant__ CUtensorMap map, TokenBox box, TokenTensor tensor,
                               const uint16_t* global, int* mismatches) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t barrier;
  init_barrier(&barrier);
  if (threadIdx.x == 0) {
    tma::arrive_expect_bytes(&barrier, kBoxBytes);
    tma::load_4d(smem, &map, &barrier, box.col, box.head, box.token, box.batch);
  }
  tma::wait(&barrier, 0);
  int bad = 0;
  for (int e = threadIdx.x; e < kBox * kBox; e += blockDim.x) {
    const int r = e / kBox, c = e % kBox, t = box.token + r;
    const uint16_t want = t < tensor.tokens ? global[box.batch * tensor.batch_stride + t * tensor.token_stride +
                                                     box.head * tensor.head_stride + box.col + c]
                                            : 0;
    bad += *reinterpret_cast<const uint16_t*>(smem + wg::tile_offset(r, c, kBox)) != want;
  }
  atomicAdd(mismatches, bad);
}

constexpr int kBlockFloats = 128 * 128, kPanelBytes = 128 * 32 * 4;

// Boxes of a block map: block 2's columns 0..127 as four panels, block 1's columns 64..95 as a fifth.
__global__ void load_block_panels(const __grid_constant__ CUtensorMap map, const float* global, int* mismatches) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t barrier;
  init_barrier(&barrier);
  if (threadIdx.x == 0) {
    tma::arrive_expect_bytes(&barrier, 5 * kPanelBytes);
    for (int panel = 0; panel < 4; ++panel) tma::load_2d(smem + panel * kPanelBytes, &map, &barrier, 32 * panel, 2 * 128);
    tma::load_2d(smem + 4 * kPanelBytes, &map, &barrier, 64, 1 * 128);
  }
  tma::wait(&barrier, 0);
  int bad = 0;
  for (int e = threadIdx.x; e < 5 * 128 * 32; e += blockDim.x) {
    const int panel = e / (128 * 32), row = (e / 32) % 128, col = e % 32;
    const float want = panel < 4 ? global[2 * kBlockFloats + row * 128 + 32 * panel + col]
                                 : global[1 * kBlockFloats + row * 128 + 64 + col];
    bad += *reinterpret_cast<const float*>(smem + panel * kPanelBytes + tma::fp32_panel_offset(row, col)) != want;
  }
  atomicAdd(mismatches, bad);
}

// `host` in device memory and a zeroed mismatch counter, freed with the object.
struct Upload {
  uint16_t* global = nullptr;
  int* mismatches = nullptr;
  explicit Upload(const std::vector<uint16_t>& host) {
    cudaMalloc(&global, host.size() * 2);
    cudaMalloc(&mismatches, sizeof(int));
    cudaMemcpy(global, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
    cudaMemset(mismatches, 0, sizeof(int));
  }
  ~Upload() {
    cudaFree(global);
    cudaFree(mismatches);
  }
  // After the kernels: the mismatch count, -1 on a CUDA error.
  int mismatch_count() const {
    if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      std::printf("CUDA error: %s\n", cudaGetErrorString(err));
      return -1;
    }
    int bad = -1;
    cudaMemcpy(&bad, mismatches, sizeof(int), cudaMemcpyDeviceToHost);
    return bad;
  }
};

// The 2-D panel map; returns the mismatching elements (-1 on an encoding or CUDA error).
int check_panel_map() {
  std::vector<uint16_t> host(kRows * kCols);
  for (int i = 0; i < kRows * kCols; ++i) host[i] = static_cast<uint16_t>(1 + i);  // distinct, non-zero
  const Upload up(host);
  CUtensorMap map;
  if (CUresult r = flashgdn::kern::encode_panel_map(&map, up.global, kRows, kCols, kCols * 2, kBox, false);
      r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    return -1;
  }
  cudaFuncSetAttribute(load_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kBoxBytes);
  load_kernel<<<1, 128, 2 * kBoxBytes>>>(map, up.global, up.mismatches);
  return up.mismatch_count();
}

// The 4-D token maps; returns the mismatching elements (-1 on an encoding or CUDA error).
int check_token_maps() {
  constexpr int kB = 2, kT = 100, kH = 3, kD = 128;
  const TokenTensor padded{0, kH * 192 + 64, 192, kT};  // batch stride below
  const int64_t batch_stride = kT * padded.token_stride + 128;
  std::vector<uint16_t> host(kB * batch_stride);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(1 + i % 65000);
  const Upload up(host);
  CUtensorMap map, single;
  const TokenTensor full{batch_stride, padded.token_stride, padded.head_stride, kT};
  // one head of batch row 0 viewed as (1, T, 1, 128): the head and batch strides 5 and 3 (not
  // 16-byte multiples) must be replaced, not passed to the driver
  const TokenTensor one_head{0, padded.token_stride, 0, kT};
  if (flashgdn::kern::encode_token_map(&map, up.global, kB, kT, kH, kD, full.batch_stride, full.token_stride,
                                       full.head_stride, false) != CUDA_SUCCESS ||
      flashgdn::kern::encode_token_map(&single, up.global, 1, kT, 1, kD, 3, one_head.token_stride, 5, false) !=
          CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled refused a token map\n");
    return -1;
  }
  cudaFuncSetAttribute(load_token_box, cudaFuncAttributeMaxDynamicSharedMemorySize, kBoxBytes);
  for (const TokenBox box : {TokenBox{64, 2, 64, 1}, TokenBox{0, 0, 0, 0}, TokenBox{64, 1, 36, 1}})
    load_token_box<<<1, 128, kBoxBytes>>>(map, box, full, up.global, up.mismatches);
  load_token_box<<<1, 128, kBoxBytes>>>(single, TokenBox{64, 0, 40, 0}, one_head, up.global, up.mismatches);
  return up.mismatch_count();
}

// The fp32 block map; returns the mismatching elements (-1 on an encoding or CUDA error).
int check_block_map() {
  std::vector<float> host(3 * kBlockFloats);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 1.f + static_cast<float>(i);  // distinct, exact in fp32
  float* global = nullptr;
  int* mismatches = nullptr;
  cudaMalloc(&global, host.size() * 4);
  cudaMalloc(&mismatches, sizeof(int));
  cudaMemcpy(global, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(mismatches, 0, sizeof(int));
  CUtensorMap map;
  int bad = -1;
  if (flashgdn::kern::encode_block_map(&map, global, 3, 32) != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled refused the block map\n");
  } else {
    cudaFuncSetAttribute(load_block_panels, cudaFuncAttributeMaxDynamicSharedMemorySize, 5 * kPanelBytes);
    load_block_panels<<<1, 256, 5 * kPanelBytes>>>(map, global, mismatches);
    if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess)
      std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    else
      cudaMemcpy(&bad, mismatches, sizeof(int), cudaMemcpyDeviceToHost);
  }
  cudaFree(global);
  cudaFree(mismatches);
  return bad;
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  const int bad_2d = check_panel_map();
  std::printf("TMA 2 boxes of 64 x 64 (128B swizzle, zero fill past row %d): %d mismatching elements: %s\n", kRows,
              bad_2d, bad_2d == 0 ? "ok" : "FAIL");
  const int bad_4d = check_token_maps();
  std::printf("TMA 4-D token boxes (padded strides, zero fill past token 100, extent-1 strides replaced): %d "
              "mismatching elements: %s\n",
              bad_4d, bad_4d == 0 ? "ok" : "FAIL");
  const int bad_blocks = check_block_map();
  std::printf("TMA fp32 block map (5 panels of [128][32], 128B swizzle): %d mismatching elements: %s\n", bad_blocks,
              bad_blocks == 0 ? "ok" : "FAIL");
  return bad_2d == 0 && bad_4d == 0 && bad_blocks == 0 ? 0 : 1;
}
