// GPU unit test of the in-kernel chunk inverse (src/kernels/sm90/warpgroup_inverse.cuh): one warpgroup
// per chunk loads K into the 128-byte-swizzled tile a TMA box gives the fused kernels, forms K K^T
// with wgmma, and inverts; X = (I + diag(beta) StrictLower(K K^T))^{-1} is compared with a float64
// forward substitution on the host for 4 x 132 chunks and one of 40 rows (rows past it zero, as the
// fused kernels see them): random unit keys in half the chunks, strongly correlated ones (larger
// entries of X) in the other half. It also reports the warpgroup's cycles per stage (clock64, median
// over the CTAs: one CTA per SM, the latency; 3 per SM, under contention) and fails on any local
// memory (spills) under a 128-register cap. The stages also write X diag(beta 2^-gcum) in bf16 (the
// fused forward's folded chunks: a 128B-swizzled wgmma operand tile, zeroed first; gcum a cumulative
// sum of random log2 gates down to about -40): checked against the same reference times the factors
// within bf16's rounding, exactly 0 above the diagonal; the cycles include those stores.
// Exit codes: 0 pass, 1 a mismatch or spills, 77 no sm_90 GPU (ctest reports a skip: CI has no GPU).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm90/wgmma.cuh"
#include "kernels/sm90/warpgroup_inverse.cuh"
#include "sm90_device.h"

namespace {

namespace kern = flashgdn::kern;
namespace wg = flashgdn::kern::wg;
constexpr int C = 64, D = 128;
constexpr int kChunks = 4 * 132 + 1, kLastRows = 40;
constexpr int T = (kChunks - 1) * C + kLastRows;
constexpr int kTileBytes = C * D * 2;
// X is kept in fp16 (2^-11 relative rounding) and merged by fp16 products: a few roundings of
// max |X| (an indexing error is of order max |X|).
constexpr double kTolerance = 2e-3;
// Timed stages: K K^T; store_l + the diagonal blocks; 16 -> 32; 32 -> 64 (each up to the barrier after it).
constexpr int kStages = 4;
constexpr const char* kStageNames[kStages] = {"K K^T", "L + diagonal blocks", "16 -> 32", "32 -> 64"};

struct Shared {
  alignas(1024) unsigned char k[kTileBytes];
  kern::WarpgroupInverse::Workspace workspace;
  kern::WarpgroupInverse::Tile x;
  alignas(1024) unsigned char x_copy[C * C * 2];  // bf16 [64][64], swizzled (wg::swizzled_offset)
  alignas(16) float beta[C];
  alignas(16) float column_scale[C];  // the copy's factors beta_t 2^-gcum[t]
};

// 128 threads; at most 128 registers (4 CTAs' worth per SM): the inverse alone, within any aux
// warpgroup's budget (fused_forward_inv.cuh's ptxas report covers the kernel's own).
__global__ void __launch_bounds__(128, 4)
    inverse_kernel(const __nv_bfloat16* k, const float* beta, const float* gcum, float* x_out, float* copy_out,
                   long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Shared& s = *reinterpret_cast<Shared*>(smem_raw);  // the kernel has no static shared memory: offset 0
  const int chunk = blockIdx.x, t0 = chunk * C, rows = min(C, T - t0);
  for (int e = threadIdx.x; e < C * 16; e += 128) {  // 16-byte vectors; the swizzle moves whole vectors
    const int row = e / 16, col = (e % 16) * 8;
    const uint4 value = row < rows ? *reinterpret_cast<const uint4*>(k + static_cast<size_t>(t0 + row) * D + col)
                                   : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(s.k + wg::tile_offset(row, col, C)) = value;
  }
  if (threadIdx.x < C) {
    s.beta[threadIdx.x] = threadIdx.x < rows ? beta[t0 + threadIdx.x] : 0.f;
    s.column_scale[threadIdx.x] = s.beta[threadIdx.x] * exp2f(-gcum[chunk * C + threadIdx.x]);
  }
  for (int e = threadIdx.x; e < C * C * 2 / 16; e += 128) reinterpret_cast<uint4*>(s.x_copy)[e] = make_uint4(0, 0, 0, 0);
  wg::fence_shared_to_async();
  __syncthreads();

  const long long start = clock64();
  float kk[32];
  wg::fence();
#pragma unroll
  for (int k0 = 0; k0 < D; k0 += 16)  // [64,64] = K[64,128] @ K^T
    wg::mma_ss<__nv_bfloat16, 64, wg::Major::kK, wg::Major::kK>(kk, wg::descriptor<wg::Major::kK>(s.k, k0, C),
                                                                wg::descriptor<wg::Major::kK>(s.k, k0, C), k0 > 0);
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(kk);
  using Inverse = kern::WarpgroupInverse;
  long long stage[kStages];
  stage[0] = clock64();
  Inverse::store_l(s.workspace, kk, s.beta);
  const Inverse::ScaledCopy scaled_copy{s.x_copy, s.column_scale};
  Inverse::invert_diagonal(s.workspace, s.x, scaled_copy);
  Inverse::sync(1);
  stage[1] = clock64();
  Inverse::merge_16_to_32(s.workspace, s.x, scaled_copy);
  Inverse::sync(1);
  stage[2] = clock64();
  Inverse::merge_32_to_64(s.workspace, s.x, scaled_copy);
  Inverse::sync(1);
  stage[3] = clock64();

  float* out = x_out + static_cast<size_t>(chunk) * C * C;
  for (int e = threadIdx.x; e < C * C / 4; e += 128) {
    const int row = e / 16, col = (e % 16) * 4;
    float x[4] = {0.f, 0.f, 0.f, 0.f};
    if (col / 16 <= row / 16) s.x.values(row, col, x);
    *reinterpret_cast<float4*>(out + row * C + col) = make_float4(x[0], x[1], x[2], x[3]);
  }
  float* copy = copy_out + static_cast<size_t>(chunk) * C * C;
  for (int e = threadIdx.x; e < C * C; e += 128)
    copy[e] = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(s.x_copy + wg::swizzled_offset(e / C, e % C)));
  if (threadIdx.x == 0) {
    cycles[kStages * chunk] = stage[0] - start;
    for (int i = 1; i < kStages; ++i) cycles[kStages * chunk + i] = stage[i] - stage[i - 1];
  }
}

// X of every chunk (rows past the tokens: K and beta 0) in float64.
std::vector<double> host_inverse(const std::vector<__nv_bfloat16>& k, const std::vector<float>& beta) {
  std::vector<double> want(static_cast<size_t>(kChunks) * C * C);
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    const int t0 = chunk * C, rows = std::min(C, T - t0);
    std::vector<double> l(C * C, 0.0);
    for (int s = 0; s < rows; ++s)
      for (int t = 0; t < s; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(__bfloat162float(k[(t0 + s) * D + d])) * __bfloat162float(k[(t0 + t) * D + d]);
        l[s * C + t] = beta[t0 + s] * dot;
      }
    double* x = &want[static_cast<size_t>(chunk) * C * C];
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < C; ++i) {
        double v = i == c ? 1.0 : 0.0;
        for (int j = 0; j < i; ++j) v -= l[i * C + j] * x[j * C + c];
        x[i * C + c] = v;
      }
  }
  return want;
}

long long median(std::vector<long long> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  cudaFuncAttributes attributes{};
  cudaFuncGetAttributes(&attributes, inverse_kernel);
  std::printf("inverse_kernel: %d registers, %zu bytes of local memory\n", attributes.numRegs,
              attributes.localSizeBytes);

  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  std::vector<__nv_bfloat16> k(static_cast<size_t>(T) * D);
  std::vector<float> common(D);
  for (int t = 0; t < T; ++t) {  // unit keys, as after the L2 norm; odd chunks: one shared direction + noise
    const bool correlated = (t / C) % 2 == 1;
    if (correlated && t % C == 0)
      for (float& x : common) x = normal(rng);
    std::vector<float> row(D);
    double norm = 0;
    for (int d = 0; d < D; ++d) {
      row[d] = correlated ? common[d] + 0.3f * normal(rng) : normal(rng);
      norm += double(row[d]) * row[d];
    }
    for (int d = 0; d < D; ++d) k[t * D + d] = __float2bfloat16(row[d] / std::sqrt(norm));
  }
  std::vector<float> beta(T);
  for (float& b : beta) b = uniform(rng);
  const std::vector<double> want = host_inverse(k, beta);
  std::vector<float> gcum(static_cast<size_t>(kChunks) * C);  // per chunk, log2 units, 0 .. about -40
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    float sum = 0.f;
    for (int t = 0; t < C; ++t) gcum[chunk * C + t] = sum -= 1.25f * uniform(rng);
  }
  // the copy's column factors beta_t 2^-gcum[t] (beta 0 past the last chunk's rows)
  const auto column_scale = [&](int chunk, int col) {
    const int t = chunk * C + col;
    return t < T ? double(beta[t]) * std::exp2(-double(gcum[t])) : 0.0;
  };

  __nv_bfloat16* k_dev = nullptr;
  float *beta_dev = nullptr, *gcum_dev = nullptr, *x_dev = nullptr, *copy_dev = nullptr;
  long long* cycles_dev = nullptr;
  const size_t x_count = static_cast<size_t>(kChunks) * C * C;
  cudaMalloc(&k_dev, k.size() * sizeof(__nv_bfloat16));
  cudaMalloc(&beta_dev, beta.size() * sizeof(float));
  cudaMalloc(&gcum_dev, gcum.size() * sizeof(float));
  cudaMalloc(&x_dev, x_count * sizeof(float));
  cudaMalloc(&copy_dev, x_count * sizeof(float));
  cudaMalloc(&cycles_dev, kStages * kChunks * sizeof(long long));
  cudaMemcpy(k_dev, k.data(), k.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
  cudaMemcpy(beta_dev, beta.data(), beta.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(gcum_dev, gcum.data(), gcum.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(x_dev, 0xff, x_count * sizeof(float));  // NaN poison
  // Two launches: every chunk at 3 CTAs per SM (checked, and timed under contention), then the
  // first 132 chunks alone on their SMs (dynamic shared memory padded to 120 KiB: the latency).
  const int smem = static_cast<int>(sizeof(Shared)), smem_alone = 120 * 1024;
  cudaFuncSetAttribute(inverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_alone);
  std::vector<long long> cycles(kStages * kChunks), cycles_alone(kStages * 132);
  inverse_kernel<<<132, 128, smem_alone>>>(k_dev, beta_dev, gcum_dev, x_dev, copy_dev, cycles_dev);
  cudaMemcpy(cycles_alone.data(), cycles_dev, cycles_alone.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  cudaMemset(x_dev, 0xff, x_count * sizeof(float));  // NaN poison again
  cudaMemset(copy_dev, 0xff, x_count * sizeof(float));
  inverse_kernel<<<kChunks, 128, smem>>>(k_dev, beta_dev, gcum_dev, x_dev, copy_dev, cycles_dev);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::vector<float> got(x_count), got_copy(x_count);
  cudaMemcpy(got.data(), x_dev, x_count * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_copy.data(), copy_dev, x_count * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(cycles.data(), cycles_dev, cycles.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  cudaFree(k_dev);
  cudaFree(beta_dev);
  cudaFree(gcum_dev);
  cudaFree(x_dev);
  cudaFree(copy_dev);
  cudaFree(cycles_dev);

  bool ok = attributes.localSizeBytes == 0;
  for (int kind = 0; kind < 2; ++kind) {  // random keys (even chunks), correlated (odd)
    double max_err = 0, max_ref = 0;
    for (int chunk = kind; chunk < kChunks; chunk += 2)
      for (int i = 0; i < C * C; ++i) {
        const size_t at = static_cast<size_t>(chunk) * C * C + i;
        const double value = got[at];
        max_err = std::isfinite(value) ? std::fmax(max_err, std::fabs(value - want[at])) : INFINITY;
        max_ref = std::fmax(max_ref, std::fabs(want[at]));
      }
    const bool pass = max_err <= kTolerance * max_ref;
    ok &= pass;
    std::printf("%-16s max |err| %.3e (max |X| %.3e, tolerance %.0e relative): %s\n",
                kind == 0 ? "random keys" : "correlated keys", max_err, max_ref, kTolerance, pass ? "ok" : "FAIL");
    // the scaled bf16 copy: one more rounding (2^-9 relative) of each entry, relative to its column's
    // largest (the factors span 2^40); exact zeros above the diagonal
    double copy_err = 0;  // max over columns of max |err| / max |X diag(f)| in the column
    bool upper_zero = true;
    for (int chunk = kind; chunk < kChunks; chunk += 2)
      for (int col = 0; col < C; ++col) {
        const double scale = column_scale(chunk, col);
        double err = 0, ref = 0;
        for (int row = 0; row < C; ++row) {
          const size_t at = static_cast<size_t>(chunk) * C * C + row * C + col;
          const double value = got_copy[at], scaled = want[at] * scale;
          err = std::isfinite(value) ? std::fmax(err, std::fabs(value - scaled)) : INFINITY;
          ref = std::fmax(ref, std::fabs(scaled));
          if (col > row) upper_zero &= value == 0.0;
        }
        if (ref > 0) copy_err = std::fmax(copy_err, err / ref);
        else copy_err = std::fmax(copy_err, err);
      }
    // relative to the column's largest entry (X_cc = 1 at least): the fp16 path's error and one rounding
    const double copy_tolerance = kTolerance * max_ref + 1.0 / 256;
    const bool copy_pass = copy_err <= copy_tolerance && upper_zero;
    ok &= copy_pass;
    std::printf("%-16s scaled bf16 copy: max |err| %.3e of its column (tolerance %.3e), zero above the diagonal: %s: %s\n",
                kind == 0 ? "random keys" : "correlated keys", copy_err, copy_tolerance, upper_zero ? "yes" : "no",
                copy_pass ? "ok" : "FAIL");
  }
  const auto report = [](const char* what, const std::vector<long long>& all) {
    const int ctas = static_cast<int>(all.size()) / kStages;
    std::printf("cycles, %s (median over %d CTAs):", what, ctas);
    long long total = 0;
    for (int i = 0; i < kStages; ++i) {
      std::vector<long long> stage(ctas);
      for (int c = 0; c < ctas; ++c) stage[c] = all[kStages * c + i];
      total += median(stage);
      std::printf(" %s %lld;", kStageNames[i], median(stage));
    }
    std::printf(" sum %lld\n", total);
  };
  report("one CTA per SM", cycles_alone);
  report("3 CTAs per SM", cycles);
  return ok ? 0 : 1;
}
