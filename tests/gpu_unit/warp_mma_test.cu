// GPU unit test of the mma.sync primitives (src/kernels/sm90/warp_mma.cuh): warp_gemm over a
// [64, 64] = [64, 128] @ [128, 64] product with 8 warps in [16, 32] tiles, for the four ways the
// fused kernels store their operands (A and B row-major or transposed), against a host GEMM of
// the same bf16 values. Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm90/warp_mma.cuh"
#include "sm90_device.h"

namespace {

using flashgdn::kern::Stored;

constexpr int M = 64, N = 64, K = 128;
constexpr int kTileElems = 128 * 72;  // the larger of [64][136] and [128][72]

// A [M][K] and B [K][N] (row-major in global memory) stored in shared memory as the variant asks:
// kRowMajor A as [M][K], kTransposed A as [K][M]; kRowMajor B as [K][N], kTransposed B as [N][K].
template <Stored kA, Stored kB>
__global__ void gemm_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
  // Rows padded by 8 elements, as in the fused kernels.
  constexpr int kPitchA = kA == Stored::kRowMajor ? K + 8 : M + 8;
  constexpr int kPitchB = kB == Stored::kRowMajor ? N + 8 : K + 8;
  __shared__ __align__(16) __nv_bfloat16 a_tile[kTileElems];
  __shared__ __align__(16) __nv_bfloat16 b_tile[kTileElems];
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) {
    const int m = e / K, k = e % K;
    a_tile[kA == Stored::kRowMajor ? m * kPitchA + k : k * kPitchA + m] = a[e];
  }
  for (int e = threadIdx.x; e < K * N; e += blockDim.x) {
    const int k = e / N, n = e % N;
    b_tile[kB == Stored::kRowMajor ? k * kPitchB + n : n * kPitchB + k] = b[e];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
  float acc[1][4][4];
  flashgdn::kern::zero(acc);
  flashgdn::kern::warp_gemm<1, 4, kA, kB>(acc, a_tile, kPitchA, b_tile, kPitchB, m0, n0, K);
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 4; ++e)
      d[flashgdn::kern::acc_row(m0, 0, e) * N + flashgdn::kern::acc_col(n0, j, e)] = acc[0][j][e];
}

template <Stored kA, Stored kB>
bool run(const char* name, const __nv_bfloat16* a, const __nv_bfloat16* b, float* d, const std::vector<double>& want) {
  cudaMemset(d, 0xff, M * N * sizeof(float));  // NaN poison
  gemm_kernel<kA, kB><<<1, 256>>>(a, b, d);
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    std::printf("%-32s CUDA error: %s\n", name, cudaGetErrorString(err));
    return false;
  }
  std::vector<float> got(M * N);
  cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
  double max_err = 0, max_ref = 0;
  for (int i = 0; i < M * N; ++i) {
    max_err = std::isfinite(got[i]) ? std::fmax(max_err, std::fabs(got[i] - want[i])) : INFINITY;
    max_ref = std::fmax(max_ref, std::fabs(want[i]));
  }
  const bool ok = max_err <= 1e-4 * max_ref;
  std::printf("%-32s max |err| %.3e (max |ref| %.3e): %s\n", name, max_err, max_ref, ok ? "ok" : "FAIL");
  return ok;
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  std::mt19937 rng(99);
  std::normal_distribution<float> normal;
  std::vector<__nv_bfloat16> a(M * K), b(K * N);
  std::vector<double> a_val(M * K), b_val(K * N), want(M * N, 0.0);
  for (int i = 0; i < M * K; ++i) a_val[i] = __bfloat162float(a[i] = __float2bfloat16(normal(rng)));
  for (int i = 0; i < K * N; ++i) b_val[i] = __bfloat162float(b[i] = __float2bfloat16(normal(rng)));
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) want[m * N + n] += a_val[m * K + k] * b_val[k * N + n];
  __nv_bfloat16 *a_dev = nullptr, *b_dev = nullptr;
  float* d_dev = nullptr;
  cudaMalloc(&a_dev, a.size() * 2);
  cudaMalloc(&b_dev, b.size() * 2);
  cudaMalloc(&d_dev, M * N * sizeof(float));
  cudaMemcpy(a_dev, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b_dev, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  bool ok = true;
  ok &= run<Stored::kRowMajor, Stored::kRowMajor>("A row-major, B row-major", a_dev, b_dev, d_dev, want);
  ok &= run<Stored::kRowMajor, Stored::kTransposed>("A row-major, B transposed", a_dev, b_dev, d_dev, want);
  ok &= run<Stored::kTransposed, Stored::kRowMajor>("A transposed, B row-major", a_dev, b_dev, d_dev, want);
  ok &= run<Stored::kTransposed, Stored::kTransposed>("A transposed, B transposed", a_dev, b_dev, d_dev, want);
  cudaFree(a_dev);
  cudaFree(b_dev);
  cudaFree(d_dev);
  return ok ? 0 : 1;
}
