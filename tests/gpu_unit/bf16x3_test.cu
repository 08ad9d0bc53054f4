// GPU unit test of the bf16x3 fp32 products (src/kernels/sm90/warp_mma.cuh: load_split_a,
// load_split_b, mma_bf16x3) at the CP correction's shape, [128, 32] = [128, 128] @ [128, 32] with
// 8 warps of [16, 32], for the four ways an fp32 operand can be stored (A and B row-major or
// transposed), against a float64 host GEMM of the same fp32 values (not bf16-representable).
// Bound: max |err| <= 2e-5 of max |ref| (bf16x3 gives ~3e-6 here). The same kernel with the hi
// parts alone (a plain bf16 product, ~1e-3) must miss the bound: the check can fail.
// Then the pre-split path (SplitTile fragments by ldmatrix, as the chunk inverse reads them), and
// accumulator_as_b (an accumulator turned into the B fragment of a next product by movmatrix): each
// [16, 8] product tile T is multiplied by a 16 x 16 row-shift matrix E (E T = T's rows rotated by 3
// within the tile), which a wrong transposition or k order cannot pass.
// Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "kernels/sm90/warp_mma.cuh"
#include "gemm_fixture.h"
#include "sm90_device.h"

namespace {

using flashgdn::kern::Stored;

constexpr int M = 128, N = 32, K = 128;
constexpr int kPitchA = 132, kPitchB = 36;  // the correction kernel's pitches (and more for [N][K])
constexpr int kPitchBt = K + 4;
constexpr int kTileA = (M > K ? M : K) * kPitchA;
constexpr int kTileB = K * kPitchB > N * kPitchBt ? K * kPitchB : N * kPitchBt;

template <Stored kA, Stored kB, bool kHiOnly>
__global__ void gemm_kernel(const float* a, const float* b, float* d) {
  extern __shared__ __align__(16) float smem[];
  float* a_tile = smem;           // [M][K] or [K][M], pitch kPitchA
  float* b_tile = smem + kTileA;  // [K][N] pitch kPitchB, or [N][K] pitch kPitchBt
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) {
    const int m = e / K, k = e % K;
    a_tile[kA == Stored::kRowMajor ? m * kPitchA + k : k * kPitchA + m] = a[e];
  }
  for (int e = threadIdx.x; e < K * N; e += blockDim.x) {
    const int k = e / N, n = e % N;
    b_tile[kB == Stored::kRowMajor ? k * kPitchB + n : n * kPitchBt + k] = b[e];
  }
  __syncthreads();
  const int m0 = 16 * (threadIdx.x / 32);
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    flashgdn::kern::SplitA af;
    flashgdn::kern::load_split_a<kA>(af, kA == Stored::kRowMajor ? a_tile + m0 * kPitchA + k0 : a_tile + k0 * kPitchA + m0,
                                     kPitchA);
    for (int j = 0; j < 4; ++j) {
      flashgdn::kern::SplitB bf;
      if constexpr (kB == Stored::kRowMajor) {
        flashgdn::kern::load_split_b<kB>(bf, b_tile + k0 * kPitchB + 8 * j, kPitchB);
      } else {
        flashgdn::kern::load_split_b<kB>(bf, b_tile + 8 * j * kPitchBt + k0, kPitchBt);
      }
      if constexpr (kHiOnly) {
        flashgdn::kern::mma_16816<__nv_bfloat16>(acc[j], af.hi, bf.hi[0], bf.hi[1]);
      } else {
        flashgdn::kern::mma_bf16x3(acc[j], af, bf);
      }
    }
  }
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 4; ++e) d[flashgdn::kern::acc_row(m0, 0, e) * N + flashgdn::kern::acc_col(0, j, e)] = acc[j][e];
}

// The same product with A and B stored split (SplitTile), then D = E T per [16, 8] tile T, E the
// 16 x 16 shift (E T)[r] = T[(r + kShift) % 16] through accumulator_as_b; kChain false: D = T.
constexpr int kShift = 3;
constexpr int kPitchSplitA = K + 8, kPitchSplitB = N + 8, kPitchShift = 24;
using SplitA_Tile = flashgdn::kern::SplitTile<M, kPitchSplitA>;
using SplitB_Tile = flashgdn::kern::SplitTile<K, kPitchSplitB>;
using Shift_Tile = flashgdn::kern::SplitTile<16, kPitchShift>;

template <bool kChain>
__global__ void split_tile_kernel(const float* a, const float* b, float* d) {
  extern __shared__ __align__(16) unsigned char split_smem[];
  auto& a_tile = *reinterpret_cast<SplitA_Tile*>(split_smem);
  auto& b_tile = *reinterpret_cast<SplitB_Tile*>(split_smem + sizeof(SplitA_Tile));
  auto& shift = *reinterpret_cast<Shift_Tile*>(split_smem + sizeof(SplitA_Tile) + sizeof(SplitB_Tile));
  for (int e = threadIdx.x; e < M * K; e += blockDim.x) a_tile.store(e / K, e % K, a[e]);
  for (int e = threadIdx.x; e < K * N / 2; e += blockDim.x)
    b_tile.store_pair(2 * e / N, 2 * e % N, b[2 * e], b[2 * e + 1]);
  for (int e = threadIdx.x; e < 16 * 16; e += blockDim.x)
    shift.store(e / 16, e % 16, e % 16 == (e / 16 + kShift) % 16 ? 1.f : 0.f);
  __syncthreads();
  const int m0 = 16 * (threadIdx.x / 32);
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    flashgdn::kern::SplitA af;
    a_tile.a_fragment(af, m0, k0);
    for (int j = 0; j < 4; ++j) {
      flashgdn::kern::SplitB bf;
      b_tile.b_fragment(bf, k0, 8 * j);
      flashgdn::kern::mma_bf16x3(acc[j], af, bf);
    }
  }
  if constexpr (kChain) {
    flashgdn::kern::SplitA ef;
    shift.a_fragment(ef, 0, 0);
    for (int j = 0; j < 4; ++j) {
      float shifted[4] = {};
      flashgdn::kern::mma_bf16x3(shifted, ef, flashgdn::kern::accumulator_as_b(acc[j]));
      for (int e = 0; e < 4; ++e) acc[j][e] = shifted[e];
    }
  }
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 4; ++e) d[flashgdn::kern::acc_row(m0, 0, e) * N + flashgdn::kern::acc_col(0, j, e)] = acc[j][e];
}

template <bool kChain>
double run_split(const char* name, const DeviceGemm<float>& gemm) {
  constexpr int smem = sizeof(SplitA_Tile) + sizeof(SplitB_Tile) + sizeof(Shift_Tile);
  cudaFuncSetAttribute(split_tile_kernel<kChain>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  gemm.poison();
  split_tile_kernel<kChain><<<1, 256, smem>>>(gemm.a, gemm.b, gemm.d);
  return gemm.relative_error(name);
}

constexpr double kBound = 2e-5;

template <Stored kA, Stored kB, bool kHiOnly>
double run(const char* name, const DeviceGemm<float>& gemm) {
  constexpr int smem = (kTileA + kTileB) * sizeof(float);
  cudaFuncSetAttribute(gemm_kernel<kA, kB, kHiOnly>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  gemm.poison();
  gemm_kernel<kA, kB, kHiOnly><<<1, 256, smem>>>(gemm.a, gemm.b, gemm.d);
  return gemm.relative_error(name);
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  const DeviceGemm<float> gemm(M, N, K, 7);
  bool ok = true;
  ok &= run<Stored::kRowMajor, Stored::kRowMajor, false>("bf16x3, A row-major, B row-major", gemm) <= kBound;
  ok &= run<Stored::kRowMajor, Stored::kTransposed, false>("bf16x3, A row-major, B transposed", gemm) <= kBound;
  ok &= run<Stored::kTransposed, Stored::kRowMajor, false>("bf16x3, A transposed, B row-major", gemm) <= kBound;
  ok &= run<Stored::kTransposed, Stored::kTransposed, false>("bf16x3, A transposed, B transposed", gemm) <= kBound;
  const double hi_only = run<Stored::kRowMajor, Stored::kRowMajor, true>("hi parts only (must miss the bound)", gemm);
  ok &= std::isfinite(hi_only) && hi_only > kBound;
  ok &= run_split<false>("bf16x3 from split tiles (ldmatrix)", gemm) <= kBound;
  // E T: the reference rows rotated by kShift within each 16-row tile.
  DeviceGemm<float> shifted(M, N, K, 7);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) shifted.want[r * N + c] = gemm.want[((r / 16) * 16 + (r % 16 + kShift) % 16) * N + c];
  ok &= run_split<true>("E T through accumulator_as_b (movmatrix)", shifted) <= kBound;
  std::printf("%s\n", ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
