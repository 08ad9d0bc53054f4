// GPU unit test of the wgmma primitives (src/kernels/sm90/wgmma.cuh): D[64,N] = A[64,128] @
// B[128,N] through eight m64nNk16 steps (N 128, 64 and 32), for every operand-major combination with A
// from shared memory (SS) and with A from registers (RS), and SS through mma_ss_k's pinned descriptors
// (pinned_descriptor + k_step), against a host GEMM of the same bf16 values.
// Exit codes: 0 all pass, 1 a mismatch (each variant's error is printed), 77 no sm_90 GPU (ctest
// reports a skip: CI has no GPU).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/sm90/wgmma.cuh"
#include "gemm_fixture.h"
#include "sm90_device.h"

namespace {

using flashgdn::kern::Stored;
using flashgdn::kern::wg::Major;
namespace wg = flashgdn::kern::wg;

constexpr int M = 64, K = 128;
constexpr int kPlainPitch = K + 8;
constexpr int kATileBytes = M * K * 2, kBTileBytes = K * 128 * 2;  // B: room for N = 128
constexpr int kSmem = kATileBytes + kBTileBytes + M * kPlainPitch * 2;

template <int N, Major kMajorA, Major kMajorB, bool kRegisterA, bool kPinned = false>
__global__ void __launch_bounds__(128) gemm_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d_out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* a_tile = smem;
  unsigned char* b_tile = smem + kATileBytes;
  auto* a_plain = reinterpret_cast<__nv_bfloat16*>(smem + kATileBytes + kBTileBytes);
  constexpr int a_rows = kMajorA == Major::kK ? M : K;  // rows per panel
  constexpr int b_rows = kMajorB == Major::kK ? N : K;
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) {
    const int m = e / K, k = e % K;
    const uint32_t at = kMajorA == Major::kK ? wg::tile_offset(m, k, a_rows) : wg::tile_offset(k, m, a_rows);
    *reinterpret_cast<__nv_bfloat16*>(a_tile + at) = a[e];
    a_plain[m * kPlainPitch + k] = a[e];
  }
  for (int e = threadIdx.x; e < K * N; e += blockDim.x) {
    const int k = e / N, n = e % N;
    const uint32_t at = kMajorB == Major::kK ? wg::tile_offset(n, k, b_rows) : wg::tile_offset(k, n, b_rows);
    *reinterpret_cast<__nv_bfloat16*>(b_tile + at) = b[e];
  }
  wg::fence_shared_to_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wg::fence_operand(d);
  wg::fence();
  if constexpr (kPinned)
    wg::mma_ss_k<__nv_bfloat16, N, kMajorA, kMajorB, K, true>(d, a_tile, a_rows, b_tile, b_rows, false);
#pragma unroll
  for (int k0 = 0; k0 < K && !kPinned; k0 += 16) {
    const uint64_t desc_b = wg::descriptor<kMajorB>(b_tile, k0, b_rows);
    if constexpr (kRegisterA) {
      uint32_t frag[4];
      flashgdn::kern::load_a<Stored::kRowMajor>(frag, a_plain, kPlainPitch, 16 * warp, k0);
      wg::fence();  // the A fragment registers were just written
      wg::mma_rs<__nv_bfloat16, N, kMajorB>(d, frag, desc_b, k0 > 0);
    } else {
      wg::mma_ss<__nv_bfloat16, N, kMajorA, kMajorB>(d, wg::descriptor<kMajorA>(a_tile, k0, a_rows), desc_b, k0 > 0);
    }
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(d);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + lane / 4 + 8 * (e / 2), col = 8 * j + 2 * (lane % 4) + e % 2;
      d_out[row * N + col] = d[4 * j + e];
    }
}

template <int N, Major kMajorA, Major kMajorB, bool kRegisterA, bool kPinned = false>
bool run(const char* name, const Bf16Gemm& gemm) {
  auto* kernel = gemm_kernel<N, kMajorA, kMajorB, kRegisterA, kPinned>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  gemm.poison();
  kernel<<<1, 128, kSmem>>>(gemm.a, gemm.b, gemm.d);
  return gemm.check(name);
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  const Bf16Gemm gemm(M, 128, K, 1234), narrow(M, 64, K, 4321), n32(M, 32, K, 987);
  bool ok = true;
  ok &= run<128, Major::kK, Major::kK, false>("SS A K-major, B K-major", gemm);
  ok &= run<128, Major::kK, Major::kMN, false>("SS A K-major, B N-major", gemm);
  ok &= run<128, Major::kMN, Major::kK, false>("SS A M-major, B K-major", gemm);
  ok &= run<128, Major::kMN, Major::kMN, false>("SS A M-major, B N-major", gemm);
  ok &= run<128, Major::kK, Major::kK, true>("RS B K-major", gemm);
  ok &= run<128, Major::kK, Major::kMN, true>("RS B N-major", gemm);
  ok &= run<64, Major::kMN, Major::kK, false>("n64 SS A M-major, B K-major", narrow);
  ok &= run<64, Major::kK, Major::kK, true>("n64 RS B K-major", narrow);
  ok &= run<64, Major::kK, Major::kMN, true>("n64 RS B N-major", narrow);
  ok &= run<32, Major::kK, Major::kK, false>("n32 SS A K-major, B K-major", n32);
  ok &= run<128, Major::kK, Major::kK, false, true>("pinned SS A K-major, B K-major", gemm);
  ok &= run<128, Major::kK, Major::kMN, false, true>("pinned SS A K-major, B N-major", gemm);
  ok &= run<128, Major::kMN, Major::kK, false, true>("pinned SS A M-major, B K-major", gemm);
  ok &= run<128, Major::kMN, Major::kMN, false, true>("pinned SS A M-major, B N-major", gemm);
  ok &= run<32, Major::kK, Major::kK, false, true>("pinned n32 SS A K-major, B K-major", n32);
  return ok ? 0 : 1;
}
