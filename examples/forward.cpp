// A GDN forward on a real problem through the C++ API (no Python): two packed sequences,
// 4 q/k heads, 8 v-heads, head dim 128, bf16 inputs, an initial state, the final state out.
// On an SM90 GPU it runs flashgdn::forward and checks o and the final state against the float64
// reference; without one it runs the reference alone and says so.
//   ./build/examples/gdn_forward
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "flashgdn/flashgdn.h"
#include "flashgdn/reference.h"
#ifdef FLASHGDN_WITH_KERNELS
#include <cuda_runtime.h>
#endif

namespace {

using flashgdn::DType;
using flashgdn::TensorRef;

constexpr int kHqk = 4, kHv = 8, kD = 128;
const std::vector<int64_t> kLengths = {1000, 1500};

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct HostProblem {
  int64_t T = 0, N = 0;
  std::vector<uint16_t> q, k, v;  // bf16 bits
  std::vector<float> g, beta, h0;
  std::vector<int32_t> cu;
  std::vector<int64_t> cu_host;
};

HostProblem make_problem(uint64_t seed) {
  HostProblem p;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  p.N = static_cast<int64_t>(kLengths.size());
  p.cu = {0};
  p.cu_host = {0};
  for (int64_t len : kLengths) {
    p.cu.push_back(p.cu.back() + static_cast<int32_t>(len));
    p.cu_host.push_back(p.cu_host.back() + len);
  }
  p.T = p.cu_host.back();
  auto unit_rows = [&](int64_t rows) {  // L2-normalised random rows of 128
    std::vector<uint16_t> out(rows * kD);
    std::vector<float> row(kD);
    for (int64_t r = 0; r < rows; ++r) {
      float norm = 0.f;
      for (float& x : row) {
        x = normal(rng);
        norm += x * x;
      }
      for (int d = 0; d < kD; ++d) out[r * kD + d] = to_bf16(row[d] / std::sqrt(norm));
    }
    return out;
  };
  p.q = unit_rows(p.T * kHqk);
  p.k = unit_rows(p.T * kHqk);
  p.v.resize(p.T * kHv * kD);
  for (auto& x : p.v) x = to_bf16(normal(rng));
  p.g.resize(p.T * kHv);
  p.beta.resize(p.T * kHv);
  for (int64_t i = 0; i < p.T * kHv; ++i) {
    const float a = normal(rng);
    p.g[i] = -std::log1p(std::exp(-a)) / 16.f;  // logsigmoid(randn) / 16
    p.beta[i] = 1.f / (1.f + std::exp(-normal(rng)));
  }
  p.h0.resize(p.N * kHv * kD * kD);
  for (auto& x : p.h0) x = normal(rng);
  return p;
}

// The problem over the given buffers (host or device); o and final_state are outputs; q, k, v and
// o are of qkv_dtype.
flashgdn::ForwardProblem describe(const HostProblem& h, DType qkv_dtype, void* q, void* k, void* v, void* g, void* beta,
                                  void* h0, void* cu, void* o, void* final_state) {
  flashgdn::ForwardProblem p;
  p.in.shape = {1, h.T, kHqk, kHv, kD, kD};
  p.in.varlen = {cu, DType::kI32, h.N, h.cu_host.data()};
  p.in.q = TensorRef::contiguous(q, qkv_dtype, {1, h.T, kHqk, kD});
  p.in.k = TensorRef::contiguous(k, qkv_dtype, {1, h.T, kHqk, kD});
  p.in.v = TensorRef::contiguous(v, qkv_dtype, {1, h.T, kHv, kD});
  p.in.g = TensorRef::contiguous(g, DType::kF32, {1, h.T, kHv});
  p.in.beta = TensorRef::contiguous(beta, DType::kF32, {1, h.T, kHv});
  p.in.initial_state = TensorRef::contiguous(h0, DType::kF32, {h.N, kHv, kD, kD});
  p.o = TensorRef::contiguous(o, qkv_dtype, {1, h.T, kHv, kD});
  p.final_state = TensorRef::contiguous(final_state, DType::kF32, {h.N, kHv, kD, kD});
  return p;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

#ifdef FLASHGDN_WITH_KERNELS
double rel_l2(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - ref[i]) * (double(x[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}
#endif

bool check(const flashgdn::Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "%s failed: %s\n", what, s.message().c_str());
  return s.ok();
}

}  // namespace

int main() {
  HostProblem h = make_problem(20261129);
  std::printf("GDN forward: %lld tokens in %lld sequences, Hqk=%d, Hv=%d, K=V=%d, bf16\n",
              static_cast<long long>(h.T), static_cast<long long>(h.N), kHqk, kHv, kD);

  // float64 reference on fp32 copies of the bf16 inputs (same values), so o is not rounded to bf16.
  std::vector<float> q32 = from_bf16(h.q), k32 = from_bf16(h.k), v32 = from_bf16(h.v);
  std::vector<float> ref_o(h.T * kHv * kD), ref_state(h.h0.size());
  auto ref = describe(h, DType::kF32, q32.data(), k32.data(), v32.data(), h.g.data(), h.beta.data(), h.h0.data(),
                      h.cu.data(), ref_o.data(), ref_state.data());
  if (!check(flashgdn::reference::forward(ref), "reference::forward")) return 1;

#ifdef FLASHGDN_WITH_KERNELS
  int devices = 0, major = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major == 9) {
    auto upload = [](const auto& host) {
      void* ptr = nullptr;
      const size_t bytes = host.size() * sizeof(host[0]);
      cudaMalloc(&ptr, bytes);
      cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice);
      return ptr;
    };
    void *q = upload(h.q), *k = upload(h.k), *v = upload(h.v), *g = upload(h.g), *beta = upload(h.beta),
         *h0 = upload(h.h0), *cu = upload(h.cu), *o = nullptr, *final_state = nullptr, *workspace = nullptr;
    cudaMalloc(&o, h.T * kHv * kD * sizeof(uint16_t));
    cudaMalloc(&final_state, h.h0.size() * sizeof(float));
    auto problem = describe(h, DType::kBF16, q, k, v, g, beta, h0, cu, o, final_state);
    std::size_t bytes = 0;
    if (!check(flashgdn::forward_workspace_size(problem, &bytes), "forward_workspace_size")) return 1;
    cudaMalloc(&workspace, bytes);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    if (!check(flashgdn::forward(problem, workspace, bytes, stream), "forward")) return 1;
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, stream);
    for (int i = 0; i < 10; ++i) flashgdn::forward(problem, workspace, bytes, stream);
    cudaEventRecord(stop, stream);
    if (cudaStreamSynchronize(stream) != cudaSuccess) return 1;
    float ms = 0.f;
    cudaEventElapsedTime(&ms, start, stop);
    std::vector<uint16_t> o_bits(h.T * kHv * kD);
    std::vector<float> state_gpu(h.h0.size());
    cudaMemcpy(o_bits.data(), o, o_bits.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(state_gpu.data(), final_state, state_gpu.size() * 4, cudaMemcpyDeviceToHost);
    const std::vector<float> o_gpu = from_bf16(o_bits);
    const double err_o = rel_l2(o_gpu, ref_o), err_s = rel_l2(state_gpu, ref_state);
    std::printf("SM90 kernels: %.3f ms per call (workspace %zu bytes); relative L2 error vs float64: "
                "o %.2e, final state %.2e\n",
                ms / 10, bytes, err_o, err_s);
    return err_o < 5e-3 && err_s < 5e-3 ? 0 : 1;
  }
  std::printf("no SM90 GPU here: ran the float64 reference only\n");
#else
  std::printf("built without CUDA kernels: ran the float64 reference only\n");
#endif
  double norm = 0;
  for (float x : ref_o) norm += double(x) * x;
  std::printf("reference: ||o|| = %.4f over %zu values\n", std::sqrt(norm), ref_o.size());
  return 0;
}
