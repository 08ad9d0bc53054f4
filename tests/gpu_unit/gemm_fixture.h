// Shared by the GPU unit tests of the GEMM primitives (warp_mma_test, wgmma_test, bf16x3_test):
// random operands of element type T (bf16: normal values rounded to bf16; float: unrounded fp32)
// with their float64 product, device copies, and the result check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// A [M][K] and B [K][N] (row-major) on the device, d [M][N] fp32 for the result, and want = A @ B
// of the same T values in float64.
template <typename T>
struct DeviceGemm {
  int m, n;
  T *a = nullptr, *b = nullptr;
  float* d = nullptr;
  std::vector<double> want;

  DeviceGemm(int M, int N, int K, unsigned seed) : m(M), n(N), want(static_cast<size_t>(M) * N, 0.0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<T> a_host(M * K), b_host(K * N);
    std::vector<double> a_val(M * K), b_val(K * N);
    for (int i = 0; i < M * K; ++i) a_val[i] = static_cast<float>(a_host[i] = static_cast<T>(normal(rng)));
    for (int i = 0; i < K * N; ++i) b_val[i] = static_cast<float>(b_host[i] = static_cast<T>(normal(rng)));
    for (int r = 0; r < M; ++r)
      for (int k = 0; k < K; ++k)
        for (int c = 0; c < N; ++c) want[r * N + c] += a_val[r * K + k] * b_val[k * N + c];
    cudaMalloc(&a, a_host.size() * sizeof(T));
    cudaMalloc(&b, b_host.size() * sizeof(T));
    cudaMalloc(&d, want.size() * sizeof(float));
    cudaMemcpy(a, a_host.data(), a_host.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(b, b_host.data(), b_host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceGemm() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
  }
  DeviceGemm(const DeviceGemm&) = delete;
  DeviceGemm& operator=(const DeviceGemm&) = delete;

  void poison() const { cudaMemset(d, 0xff, want.size() * sizeof(float)); }  // NaN

  // After a launch into d: max |d - want| / max |want|, infinite on a CUDA error or where d is not
  // finite (e.g. still poisoned); prints one line.
  double relative_error(const char* name) const {
    if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      std::printf("%-40s CUDA error: %s\n", name, cudaGetErrorString(err));
      return INFINITY;
    }
    std::vector<float> got(want.size());
    cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_err = std::isfinite(got[i]) ? std::fmax(max_err, std::fabs(got[i] - want[i])) : INFINITY;
      max_ref = std::fmax(max_ref, std::fabs(want[i]));
    }
    std::printf("%-40s max |err| / max |ref| %.3e\n", name, max_err / max_ref);
    return max_err / max_ref;
  }

  // The bf16 GEMM tests' check: relative error within 1e-4.
  bool check(const char* name) const { return relative_error(name) <= 1e-4; }
};

using Bf16Gemm = DeviceGemm<__nv_bfloat16>;
