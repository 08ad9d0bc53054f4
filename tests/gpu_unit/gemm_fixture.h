// Shared by the GPU unit tests of the GEMM primitives (warp_mma_test, wgmma_test): random bf16
// operands with their float64 product, device copies, and the result check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// A [M][K] and B [K][N] (row-major, normal bf16 values) on the device, d [M][N] fp32 for the
// result, and want = A @ B of the same bf16 values in float64.
struct Bf16Gemm {
  int m, n;
  __nv_bfloat16 *a = nullptr, *b = nullptr;
  float* d = nullptr;
  std::vector<double> want;

  Bf16Gemm(int M, int N, int K, unsigned seed) : m(M), n(N), want(static_cast<size_t>(M) * N, 0.0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<__nv_bfloat16> a_host(M * K), b_host(K * N);
    std::vector<double> a_val(M * K), b_val(K * N);
    for (int i = 0; i < M * K; ++i) a_val[i] = __bfloat162float(a_host[i] = __float2bfloat16(normal(rng)));
    for (int i = 0; i < K * N; ++i) b_val[i] = __bfloat162float(b_host[i] = __float2bfloat16(normal(rng)));
    for (int r = 0; r < M; ++r)
      for (int k = 0; k < K; ++k)
        for (int c = 0; c < N; ++c) want[r * N + c] += a_val[r * K + k] * b_val[k * N + c];
    cudaMalloc(&a, a_host.size() * sizeof(__nv_bfloat16));
    cudaMalloc(&b, b_host.size() * sizeof(__nv_bfloat16));
    cudaMalloc(&d, want.size() * sizeof(float));
    cudaMemcpy(a, a_host.data(), a_host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
    cudaMemcpy(b, b_host.data(), b_host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
  }
  ~Bf16Gemm() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
  }
  Bf16Gemm(const Bf16Gemm&) = delete;
  Bf16Gemm& operator=(const Bf16Gemm&) = delete;

  void poison() const { cudaMemset(d, 0xff, want.size() * sizeof(float)); }  // NaN

  // After a launch into d: a CUDA error, or the largest |d - want| (infinite where d is not finite,
  // e.g. still poisoned) against 1e-4 of the largest |want|. Prints one line.
  bool check(const char* name) const {
    if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      std::printf("%-32s CUDA error: %s\n", name, cudaGetErrorString(err));
      return false;
    }
    std::vector<float> got(want.size());
    cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_err = std::isfinite(got[i]) ? std::fmax(max_err, std::fabs(got[i] - want[i])) : INFINITY;
      max_ref = std::fmax(max_ref, std::fabs(want[i]));
    }
    const bool ok = max_err <= 1e-4 * max_ref;
    std::printf("%-32s max |err| %.3e (max |ref| %.3e): %s\n", name, max_err, max_ref, ok ? "ok" : "FAIL");
    return ok;
  }
};
