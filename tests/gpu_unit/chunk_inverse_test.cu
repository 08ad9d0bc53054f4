// GPU unit test of the chunk inverse (src/kernels/sm90/chunk_inverse.cuh): A_r = (I + StrictLower(
// diag(beta) K K^T))^{-1} per (chunk, v-head) against a float64 forward substitution on the host, on
// 200 tokens (three full chunks and one of 8 rows) and six value heads sharing one key head, with
// fp32 storage of A_r (split bf16 merges, and fp16 merges), the fp32 inverse's fp16 rows (fp16 merges,
// ForwardParams::inverse_rows_fp16: as accurate as its fp32 rows) and bf16 storage (fp16 merges), and 1, 4
// (groups of 4 and 2) and launcher-chosen v-heads per CTA;
// entries above the diagonal are checked too, and the rows of the last chunk past the 200 tokens (a
// guard zone after the output) must stay untouched. With gates, the 16-bit inverse's fp16 rows beside Ag
// (ForwardParams::inverse_rows_fp16 with gated_inverse_out: the forward keeping the inverse cache) must
// equal the fp32 inverse's (fp16 merges and rows, gated_inverse_out: the backward's) byte for byte, its
// gate records and window terms too.
// Exit codes: 0 pass, 1 a mismatch, 77 no sm_90 GPU (ctest reports a skip: CI has no GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/sm90/forward_launch.cuh"
#include "sm90_device.h"

namespace {

namespace kern = flashgdn::kern;
constexpr int T = 200, Hqk = 1, Hv = 6, D = 128, C = 64;
constexpr int kChunks = (T + C - 1) / C;

// want[(t * Hv + h) * C + j]: A_r row of token t (its chunk's row t % C), column j.
std::vector<double> host_inverse(const std::vector<__nv_bfloat16>& k, const std::vector<float>& beta) {
  std::vector<double> want(static_cast<size_t>(T) * Hv * C, 0.0);
  for (int h = 0; h < Hv; ++h)
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const int t0 = chunk * C, rows = std::min(C, T - t0);
      std::vector<double> l(C * C, 0.0), x(C * C, 0.0);
      for (int s = 0; s < rows; ++s)
        for (int t = 0; t < s; ++t) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double(__bfloat162float(k[(t0 + s) * D + d])) * __bfloat162float(k[(t0 + t) * D + d]);
          l[s * C + t] = beta[(t0 + s) * Hv + h] * dot;
        }
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < C; ++i) {
          double v = i == c ? 1.0 : 0.0;
          for (int j = 0; j < i; ++j) v -= l[i * C + j] * x[j * C + c];
          x[i * C + c] = v;
        }
      for (int s = 0; s < rows; ++s)
        for (int j = 0; j < C; ++j) want[(static_cast<size_t>(t0 + s) * Hv + h) * C + j] = x[s * C + j];
    }
  return want;
}

double to_double(float x) { return x; }
double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
double to_double(__half x) { return __half2float(x); }

// The test's problem for the chunk inverse: one sequence of T tokens, K [T, Hqk, D], beta [T, Hv].
kern::ForwardParams inverse_problem(const __nv_bfloat16* k_dev, const float* beta_dev) {
  kern::ForwardParams p;
  p.k = k_dev;
  p.k_strides = {static_cast<int64_t>(T) * Hqk * D, Hqk * D, D};
  p.beta = beta_dev;
  p.beta_strides = {static_cast<int64_t>(T) * Hv, Hv, 1};
  p.batch = 1;
  p.seqlen = T;
  p.num_seqs = 1;
  p.num_qk_heads = Hqk;
  p.num_v_heads = Hv;
  p.max_chunks = kChunks;
  return p;
}

// InverseT: the rows' type as written (__half: the fp32 inverse's fp16 rows, inverse_rows_fp16).
template <kern::InverseKind I, typename InverseT = kern::InverseType<I>>
bool run(const char* name, kern::InverseMerges merges, int heads_per_cta, const __nv_bfloat16* k_dev,
         const float* beta_dev, const std::vector<double>& want, double tolerance, std::vector<double>* values = nullptr) {
  const size_t count = static_cast<size_t>(T) * Hv * C;
  const size_t guarded = static_cast<size_t>(kChunks * C) * Hv * C;  // rows up to the last chunk's end
  InverseT* inverse = nullptr;
  cudaMalloc(&inverse, guarded * sizeof(InverseT));
  cudaMemset(inverse, 0xff, guarded * sizeof(InverseT));  // NaN poison
  kern::ForwardParams p = inverse_problem(k_dev, beta_dev);
  p.inverse = inverse;
  p.inverse_rows_fp16 = std::is_same_v<InverseT, __half>;
  p.inverse_heads_per_cta = heads_per_cta;
  cudaError_t err = kern::launch_chunk_inverse<kern::ElemKind::kBF16, I>(p, merges, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("%-20s CUDA error: %s\n", name, cudaGetErrorString(err));
    cudaFree(inverse);
    return false;
  }
  std::vector<InverseT> got(guarded);
  cudaMemcpy(got.data(), inverse, guarded * sizeof(InverseT), cudaMemcpyDeviceToHost);
  cudaFree(inverse);
  const auto* guard = reinterpret_cast<const unsigned char*>(got.data() + count);
  const bool guard_intact =
      std::all_of(guard, guard + (guarded - count) * sizeof(InverseT), [](unsigned char x) { return x == 0xff; });
  double max_err = 0, max_ref = 0;
  if (values != nullptr) values->resize(count);
  for (size_t i = 0; i < count; ++i) {
    const double value = to_double(got[i]);
    if (values != nullptr) (*values)[i] = value;
    max_err = std::isfinite(value) ? std::fmax(max_err, std::fabs(value - want[i])) : INFINITY;
    max_ref = std::fmax(max_ref, std::fabs(want[i]));
  }
  const bool ok = max_err <= tolerance * max_ref && guard_intact;
  std::printf("%-20s %d heads per CTA: max |err| %.3e (max |A_r| %.3e, tolerance %.0e relative), rows past the tokens %s: %s\n",
              name, heads_per_cta, max_err, max_ref, tolerance, guard_intact ? "untouched" : "WRITTEN", ok ? "ok" : "FAIL");
  return ok;
}

// The inverse cache's outputs (runtime/common.h's InverseCacheLayout) of kind I, 0xff-poisoned first.
struct CacheOutputs {
  std::vector<uint16_t> rows, gated;  // A_r's fp16 rows, Ag in bf16
  std::vector<float> gates, windows;  // the gate records, the window terms
};

template <typename T>
T* poisoned_device(size_t count) {
  T* ptr = nullptr;
  cudaMalloc(&ptr, count * sizeof(T));
  cudaMemset(ptr, 0xff, count * sizeof(T));
  return ptr;
}

template <typename T>
std::vector<T> to_host_and_free(T* ptr, size_t count) {
  std::vector<T> host(count);
  cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(ptr);
  return host;
}

template <kern::InverseKind I>
bool cache_outputs(int heads_per_cta, const __nv_bfloat16* k_dev, const float* beta_dev, const float* g_dev,
                   CacheOutputs& out) {
  const size_t count = static_cast<size_t>(kChunks * C) * Hv * C;  // rows up to the last chunk's end
  kern::ForwardParams p = inverse_problem(k_dev, beta_dev);
  p.g = g_dev;
  p.g_strides = {static_cast<int64_t>(T) * Hv, Hv, 1};
  p.inverse_heads_per_cta = heads_per_cta;
  auto* rows = poisoned_device<uint16_t>(count);
  auto* gated = poisoned_device<uint16_t>(count);
  auto* gates = poisoned_device<float>(static_cast<size_t>(kChunks) * Hv * 2 * C);
  auto* windows = poisoned_device<float>(static_cast<size_t>(kChunks) * Hv);
  p.inverse = rows;
  p.inverse_rows_fp16 = true;
  p.gated_inverse_out = gated;
  p.chunk_gates = gates;
  p.chunk_window_terms = windows;
  cudaError_t err = kern::launch_chunk_inverse<kern::ElemKind::kBF16, I>(p, kern::InverseMerges::kHalf, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  out.rows = to_host_and_free(rows, count);
  out.gated = to_host_and_free(gated, count);
  out.gates = to_host_and_free(gates, static_cast<size_t>(kChunks) * Hv * 2 * C);
  out.windows = to_host_and_free(windows, static_cast<size_t>(kChunks) * Hv);
  if (err != cudaSuccess) std::printf("inverse cache outputs: CUDA error: %s\n", cudaGetErrorString(err));
  return err == cudaSuccess;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The 16-bit inverse's cache outputs against the fp32 inverse's, byte for byte.
bool check_cache_outputs(int heads_per_cta, const __nv_bfloat16* k_dev, const float* beta_dev, const float* g_dev) {
  CacheOutputs half, fp32;
  if (!cache_outputs<kern::InverseKind::kBF16>(heads_per_cta, k_dev, beta_dev, g_dev, half) ||
      !cache_outputs<kern::InverseKind::kF32>(heads_per_cta, k_dev, beta_dev, g_dev, fp32))
    return false;
  const bool ok = same_bytes(half.rows, fp32.rows) && same_bytes(half.gated, fp32.gated) &&
                  same_bytes(half.gates, fp32.gates) && same_bytes(half.windows, fp32.windows);
  std::printf("16-bit inverse's fp16 rows, Ag, gate records, window terms, %d heads per CTA: %s\n", heads_per_cta,
              ok ? "the fp32 inverse's bytes: ok" : "DIFFER from the fp32 inverse's: FAIL");
  return ok;
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  std::vector<__nv_bfloat16> k(static_cast<size_t>(T) * D);
  for (int t = 0; t < T; ++t) {  // unit keys, as after the L2 norm
    std::vector<float> row(D);
    double norm = 0;
    for (float& x : row) {
      x = normal(rng);
      norm += double(x) * x;
    }
    for (int d = 0; d < D; ++d) k[t * D + d] = __float2bfloat16(row[d] / std::sqrt(norm));
  }
  std::vector<float> beta(static_cast<size_t>(T) * Hv), g(static_cast<size_t>(T) * Hv);
  for (float& b : beta) b = uniform(rng);
  for (float& x : g) x = -0.3f * uniform(rng);  // log gates
  const std::vector<double> want = host_inverse(k, beta);
  __nv_bfloat16* k_dev = nullptr;
  float *beta_dev = nullptr, *g_dev = nullptr;
  cudaMalloc(&k_dev, k.size() * sizeof(__nv_bfloat16));
  cudaMalloc(&beta_dev, beta.size() * sizeof(float));
  cudaMalloc(&g_dev, g.size() * sizeof(float));
  cudaMemcpy(k_dev, k.data(), k.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
  cudaMemcpy(beta_dev, beta.data(), beta.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(g_dev, g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice);
  bool ok = true;
  for (const int heads_per_cta : {0, 1, 4}) {  // 0: the launcher's choice
    ok &= run<kern::InverseKind::kF32>("A_r in fp32, bf16x3", kern::InverseMerges::kSplit, heads_per_cta, k_dev,
                                       beta_dev, want, 1e-4);
    std::vector<double> fp32_rows, fp16_rows;
    ok &= run<kern::InverseKind::kF32>("A_r in fp32, fp16", kern::InverseMerges::kHalf, heads_per_cta, k_dev,
                                       beta_dev, want, 3e-3, &fp32_rows);
    ok &= run<kern::InverseKind::kF32, __half>("A_r in fp16 rows, fp16", kern::InverseMerges::kHalf, heads_per_cta,
                                               k_dev, beta_dev, want, 3e-3, &fp16_rows);
    const bool same = fp32_rows == fp16_rows;  // fp16 merges hold X in fp16: its fp16 rows are exact
    std::printf("fp16 rows equal to the fp32 rows of fp16 merges: %s\n", same ? "ok" : "FAIL");
    ok &= same;
    ok &= run<kern::InverseKind::kBF16>("A_r in bf16", kern::InverseMerges::kHalf, heads_per_cta, k_dev, beta_dev,
                                        want, 1e-2);
    ok &= check_cache_outputs(heads_per_cta, k_dev, beta_dev, g_dev);
  }
  {  // split merges are for the fp32 inverse, in fp32 rows, only: refused for bf16 storage and fp16 rows
    kern::ForwardParams p;
    p.max_chunks = 1;
    p.num_v_heads = 1;
    const cudaError_t err =
        kern::launch_chunk_inverse<kern::ElemKind::kBF16, kern::InverseKind::kBF16>(p, kern::InverseMerges::kSplit, nullptr);
    std::printf("bf16 storage with split merges: %s\n", err == cudaErrorInvalidValue ? "refused: ok" : "NOT refused: FAIL");
    ok &= err == cudaErrorInvalidValue;
    p.inverse_rows_fp16 = true;  // fp16 rows of split merges would not be exact
    const cudaError_t split_fp16 =
        kern::launch_chunk_inverse<kern::ElemKind::kBF16, kern::InverseKind::kF32>(p, kern::InverseMerges::kSplit, nullptr);
    std::printf("fp16 rows with split merges: %s\n", split_fp16 == cudaErrorInvalidValue ? "refused: ok" : "NOT refused: FAIL");
    ok &= split_fp16 == cudaErrorInvalidValue;
    // the 16-bit inverse's fp16 rows only beside Ag, and Ag beside them only
    const cudaError_t rows_alone =
        kern::launch_chunk_inverse<kern::ElemKind::kBF16, kern::InverseKind::kBF16>(p, kern::InverseMerges::kHalf, nullptr);
    p.inverse_rows_fp16 = false;
    p.gated_inverse_out = const_cast<__nv_bfloat16*>(k_dev);  // never written: refused before the launch
    const cudaError_t ag_alone =
        kern::launch_chunk_inverse<kern::ElemKind::kBF16, kern::InverseKind::kBF16>(p, kern::InverseMerges::kHalf, nullptr);
    const bool refused = rows_alone == cudaErrorInvalidValue && ag_alone == cudaErrorInvalidValue;
    std::printf("16-bit inverse, fp16 rows without Ag or Ag beside bf16 rows: %s\n",
                refused ? "refused: ok" : "NOT refused: FAIL");
    ok &= refused;
  }
  cudaFree(k_dev);
  cudaFree(beta_dev);
  cudaFree(g_dev);
  return ok ? 0 : 1;
}
