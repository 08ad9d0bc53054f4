// GPU unit test of the mma.sync primitives (src/kernels/sm90/warp_mma.cuh): warp_gemm over a
// [64, 64] = [64, 128] @ [128, 64] product with 8 warps in [16, 32] tiles, for the four ways the
// fused kernels store their operands (A and B row-major or transposed), against a host GEMM of
// the same bf16 values. Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/sm90/warp_mma.cuh"
#include "gemm_fixture.h"
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
bool run(const char* name, const Bf16Gemm& gemm) {
  gemm.poison();
  gemm_kernel<kA, kB><<<1, 256>>>(gemm.a, gemm.b, gemm.d);
  return gemm.check(name);
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  const Bf16Gemm gemm(M, N, K, 99);
  bool ok = true;
  ok &= run<Stored::kRowMajor, Stored::kRowMajor>("A row-major, B row-major", gemm);
  ok &= run<Stored::kRowMajor, Stored::kTransposed>("A row-major, B transposed", gemm);
  ok &= run<Stored::kTransposed, Stored::kRowMajor>("A transposed, B row-major", gemm);
  ok &= run<Stored::kTransposed, Stored::kTransposed>("A transposed, B transposed", gemm);
  return ok ? 0 : 1;
}
