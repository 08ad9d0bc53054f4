// Shared by the GPU unit tests: whether an sm_90 GPU is present (ctest counts exit code 77 as skipped).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

inline constexpr int kSkipped = 77;

// True when device 0 is an sm_90 GPU; otherwise prints why the test is skipped.
inline bool have_sm90_device() {
  int devices = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return false;
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    std::printf("compute capability %d.%d, not 9.0: skipped\n", major, minor);
    return false;
  }
  return true;
}
