// GPU unit test of the CP chains' step (src/kernels/sm90/chain_step.cuh): one CTA of 256 threads
// places M (four [128][32] fp32 panels in the TMA's 128-byte swizzle), the base slice and the running
// slice S (SliceBuffer, S^T bf16 hi/lo panels) in shared memory, forms next = base + A S with A = M or
// M^T (k-half 0 and 1 as two RS wgmma commit groups, A split in registers) and stores it to columns
// col0 .. col0 + kCols - 1 of a [128][128] fp32 state (the rest must stay untouched) and into a
// second SliceBuffer; both slice widths (kCols 32 at col0 32, 16 at col0 48).
// Checked against a float64 product on random inputs: every element within the bf16x3 bound
// (4e-5 of sum |A| |S| plus 1e-6 of the value), the stored slice within 2^-16 of the fp32 result.
// Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm90/chain_step.cuh"
#include "sm90_device.h"

namespace {

namespace chain = flashgdn::kern::chain;
namespace tma = flashgdn::kern::tma;
namespace wg = flashgdn::kern::wg;
using flashgdn::kern::kHeadDim;

template <int kCols>
constexpr int kCol0 = kCols == 32 ? 32 : 48;

template <int kCols>
struct StepSmem {
  alignas(1024) unsigned char m[4][chain::kPanelBytes];
  alignas(1024) unsigned char base[chain::kPanelBytes];
  chain::SliceBuffer<kCols> s_in, s_out;
};

// m: [128][128] row-major; s, base: [128][kCols]; out: [128][128] (columns kCol0.. written);
// slice_back: [128][kCols], the stored running slice read back as hi + lo.
template <int kCols, bool kTransposed>
__global__ void __launch_bounds__(chain::kChainThreads) step_kernel(const float* m, const float* s, const float* base,
                                                                     float* out, float* slice_back) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  StepSmem<kCols>& smem = *reinterpret_cast<StepSmem<kCols>*>(smem_raw);
  for (int e = threadIdx.x; e < kHeadDim * kHeadDim; e += blockDim.x) {
    const int row = e / kHeadDim, col = e % kHeadDim;
    *reinterpret_cast<float*>(smem.m[col / chain::kPanelCols] + tma::fp32_panel_offset(row, col % chain::kPanelCols)) = m[e];
  }
  for (int e = threadIdx.x; e < kHeadDim * kCols; e += blockDim.x) {
    const int k = e / kCols, n = e % kCols;
    *reinterpret_cast<float*>(smem.base + tma::fp32_panel_offset(k, n)) = base[e];
    smem.s_in.template store<kTransposed>(k, n, s[e]);
  }
  wg::fence_shared_to_async();
  __syncthreads();
  float acc[kCols / 2];
  chain::load_step_base<kCols, kTransposed>(smem.base, acc);
  chain::HalfA a0, a1;
  chain::load_step_a<kTransposed>(smem.m, 0, a0);
  chain::load_step_a<kTransposed>(smem.m, 1, a1);
  chain::issue_step_half(acc, a0, 0, smem.s_in);
  chain::issue_step_half(acc, a1, 1, smem.s_in);
  wg::wait<0>();
  wg::fence_operand(acc);
  chain::store_step<kTransposed>(acc, &smem.s_out, out, kCol0<kCols>);
  __syncthreads();
  for (int e = threadIdx.x; e < kHeadDim * kCols; e += blockDim.x) slice_back[e] = smem.s_out.template value<kTransposed>(e / kCols, e % kCols);
}

#define CHECK_CUDA(x)                                                           \
  do {                                                                          \
    if (cudaError_t err = (x); err != cudaSuccess) {                            \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err)); \
      return false;                                                             \
    }                                                                           \
  } while (0)

template <int kCols, bool kTransposed>
bool run(std::mt19937& rng) {
  constexpr int col0 = kCol0<kCols>;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> m(kHeadDim * kHeadDim), s(kHeadDim * kCols), base(kHeadDim * kCols);
  for (float& x : m) x = normal(rng) / std::sqrt(float{kHeadDim});
  for (float& x : s) x = normal(rng);
  for (float& x : base) x = normal(rng);
  float *d_m, *d_s, *d_base, *d_out, *d_slice;
  CHECK_CUDA(cudaMalloc(&d_m, m.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_s, s.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_base, base.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_out, kHeadDim * kHeadDim * 4));
  CHECK_CUDA(cudaMalloc(&d_slice, s.size() * 4));
  CHECK_CUDA(cudaMemcpy(d_m, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_s, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_base, base.data(), base.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(d_out, 0xff, kHeadDim * kHeadDim * 4));  // NaN poison
  CHECK_CUDA(cudaMemset(d_slice, 0xff, s.size() * 4));
  constexpr int smem = sizeof(StepSmem<kCols>);
  CHECK_CUDA(
      cudaFuncSetAttribute(step_kernel<kCols, kTransposed>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  step_kernel<kCols, kTransposed><<<1, chain::kChainThreads, smem>>>(d_m, d_s, d_base, d_out, d_slice);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> out(kHeadDim * kHeadDim), slice(s.size());
  CHECK_CUDA(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(slice.data(), d_slice, slice.size() * 4, cudaMemcpyDeviceToHost));
  for (float* p : {d_m, d_s, d_base, d_out, d_slice}) cudaFree(p);

  int bad = 0;
  double worst = 0.0;  // largest error relative to its bound
  for (int i = 0; i < kHeadDim; ++i)
    for (int c = 0; c < kHeadDim; ++c) {
      const float got = out[i * kHeadDim + c];
      if (c < col0 || c >= col0 + kCols) {  // outside the slice: untouched
        bad += !std::isnan(got);
        continue;
      }
      const int n = c - col0;
      double ref = base[i * kCols + n], magnitude = 0.0;
      for (int k = 0; k < kHeadDim; ++k) {
        const double a = kTransposed ? m[k * kHeadDim + i] : m[i * kHeadDim + k];
        ref += a * s[k * kCols + n];
        magnitude += std::fabs(a * s[k * kCols + n]);
      }
      const double err = std::fabs(got - ref), bound = 4e-5 * magnitude + 1e-6 * std::fabs(ref);
      worst = std::fmax(worst, err / bound);
      if (!(err <= bound)) {
        if (bad < 5) std::printf("  (%d, %d): got %.7g, float64 %.7g (bound %.2g)\n", i, n, got, ref, bound);
        ++bad;
      }
      const float back = slice[i * kCols + n];
      if (!(std::fabs(back - got) <= std::ldexp(std::fabs(got), -16))) {
        if (bad < 5) std::printf("  slice (%d, %d): %.7g, stored %.7g\n", i, n, back, got);
        ++bad;
      }
    }
  std::printf("%d columns, %s: %d mismatches, worst error / bound %.3f\n", kCols, kTransposed ? "A = M^T" : "A = M",
              bad, worst);
  return bad == 0;
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  std::mt19937 rng(20261130);
  bool ok = true;
  for (int trial = 0; trial < 3; ++trial) {
    ok = run<32, false>(rng) && ok;
    ok = run<32, true>(rng) && ok;
    ok = run<16, false>(rng) && ok;
    ok = run<16, true>(rng) && ok;
  }
  std::printf(ok ? "chain_step: PASS\n" : "chain_step: FAIL\n");
  return ok ? 0 : 1;
}
