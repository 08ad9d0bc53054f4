// GPU unit test of stmatrix_x4 and its pairing with ldmatrix_x4 (src/kernels/sm90/warp_mma.cuh), as
// the wgmma forward uses them: one warp stores a [16, 16] block held in the m16n8 accumulator
// layout (two 8-column blocks: registers {rows 0-7, cols 0-7}, {rows 8-15, cols 0-7}, {rows 0-7,
// cols 8-15}, {rows 8-15, cols 8-15}) into a 128B-swizzled tile through per-lane row addresses,
// every element must land at its (row, column) (16-bit position codes), and ldmatrix_x4 from the
// same addresses must give the registers back; stmatrix_x4_trans (fused_forward_rs.cuh) stores the
// same registers as the tile's transpose: (row, col) must land at (col, row). Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/sm90/wgmma.cuh"
#include "sm90_device.h"

namespace {

namespace kern = flashgdn::kern;
constexpr int kRows = 64, kCols = 64;  // one 128-byte-swizzled panel of 64 rows

// The 16-bit pattern stored at (row, col): its position (stmatrix moves b16 bits, whatever they mean).
__host__ __device__ uint32_t code(int row, int col) { return static_cast<uint32_t>(row * kCols + col); }

// Warp w stores rows 16 w .. 16 w + 15, columns 16 j .. 16 j + 15 for j = 0..3, of the panel.
__global__ void round_trip(uint16_t* out, uint16_t* out_transposed, int* mismatches) {
  __shared__ __align__(1024) unsigned char panel[kRows * 128];
  __shared__ __align__(1024) unsigned char panel_transposed[kCols * 128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, c = 2 * (lane % 4);
  for (int j = 0; j < 4; ++j) {
    uint32_t regs[4];
    for (int m = 0; m < 4; ++m) {  // matrix m: row half m % 2, column block m / 2
      const int row = 16 * warp + 8 * (m % 2) + r, col = 16 * j + 8 * (m / 2) + c;
      regs[m] = code(row, col) | code(row, col + 1) << 16;
    }
    const int m = lane / 8;  // this lane's row address: matrix m, row lane % 8
    unsigned char* row_ptr =
        panel + kern::wg::swizzled_offset(16 * warp + 8 * (m % 2) + lane % 8, 16 * j + 8 * (m / 2));
    kern::stmatrix_x4(row_ptr, regs);
    // Transposed: matrix m lands as rows (columns of the tile) 16 j + 8 (m / 2) .., at column
    // (tile row) 16 w + 8 (m % 2).
    kern::stmatrix_x4_trans(
        panel_transposed + kern::wg::swizzled_offset(16 * j + 8 * (m / 2) + lane % 8, 16 * warp + 8 * (m % 2)), regs);
    __syncwarp();
    uint32_t back[4];
    kern::ldmatrix_x4(back, row_ptr);
    for (int i = 0; i < 4; ++i)
      if (back[i] != regs[i]) atomicAdd(mismatches, 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kRows * kCols; e += blockDim.x) {
    const int row = e / kCols, col = e % kCols;
    out[e] = *reinterpret_cast<const uint16_t*>(panel + kern::wg::swizzled_offset(row, col));
    out_transposed[e] = *reinterpret_cast<const uint16_t*>(panel_transposed + kern::wg::swizzled_offset(col, row));
  }
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  uint16_t *out = nullptr, *out_transposed = nullptr;
  int* mismatches = nullptr;
  cudaMalloc(&out, kRows * kCols * sizeof(uint16_t));
  cudaMalloc(&out_transposed, kRows * kCols * sizeof(uint16_t));
  cudaMalloc(&mismatches, sizeof(int));
  cudaMemset(mismatches, 0, sizeof(int));
  round_trip<<<1, 128>>>(out, out_transposed, mismatches);
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::vector<uint16_t> got(kRows * kCols), got_transposed(kRows * kCols);
  cudaMemcpy(got_transposed.data(), out_transposed, got.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost);
  int round_trip_mismatches = 0;
  cudaMemcpy(got.data(), out, got.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost);
  cudaMemcpy(&round_trip_mismatches, mismatches, sizeof(int), cudaMemcpyDeviceToHost);
  int misplaced = 0, misplaced_transposed = 0;
  for (int row = 0; row < kRows; ++row)
    for (int col = 0; col < kCols; ++col) {
      const uint32_t want = code(row, col);
      if (got[row * kCols + col] != want && misplaced++ < 5)
        std::printf("(%d, %d): got %u, want %u\n", row, col, got[row * kCols + col], want);
      if (got_transposed[row * kCols + col] != want && misplaced_transposed++ < 5)
        std::printf("transposed (%d, %d): got %u, want %u\n", row, col, got_transposed[row * kCols + col], want);
    }
  cudaFree(out);
  cudaFree(out_transposed);
  cudaFree(mismatches);
  const bool ok = misplaced == 0 && round_trip_mismatches == 0 && misplaced_transposed == 0;
  std::printf("stmatrix_x4 into a swizzled panel: %d misplaced elements, %d ldmatrix_x4 round-trip mismatches, "
              "stmatrix_x4_trans: %d misplaced: %s\n",
              misplaced, round_trip_mismatches, misplaced_transposed, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
