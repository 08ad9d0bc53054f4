// flashgdn::distributed::forward over NCCL with one thread per GPU (at least 2 sm_90 GPUs, else
// skipped): two batch entries sharded over every GPU of the machine (unequal slices; the first
// slice empty; the last empty) and over one GPU alone, against the single-GPU forward of the
// whole sequences on GPU 0 (same bf16 inputs, outputs NaN-filled first): o and the final state
// (on every rank) within 1e-2 relative L2. Heads:
// g = 0 (the exact transitions travel), strong decay (the windows zero them), mild decay; with an
// initial state, and the final state in the V-first layout.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "flashgdn/distributed.h"
#include "sm90_device.h"

namespace {

constexpr int B = 2, T = 3000, Hqk = 2, Hv = 4, D = 128;

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

template <typename T_>
T_* upload(const std::vector<T_>& host) {
  T_* dev = nullptr;  // at least one element: an empty slice still has a (valid, unread) address
  CHECK_CUDA(cudaMalloc(&dev, std::max<size_t>(host.size(), 1) * sizeof(T_)));
  if (!host.empty()) CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(T_), cudaMemcpyHostToDevice));
  return dev;
}
template <typename T_>
std::vector<T_> download(const T_* dev, size_t n) {
  std::vector<T_> host(n);
  CHECK_CUDA(cudaMemcpy(host.data(), dev, n * sizeof(T_), cudaMemcpyDeviceToHost));
  return host;
}

flashgdn::TensorRef ref(void* data, flashgdn::DType dtype, std::vector<int64_t> sizes) {
  flashgdn::TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(sizes.size());
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) t.sizes[i] = sizes[i], t.strides[i] = stride, stride *= sizes[i];
  return t;
}

// Host inputs of the whole sequences: [B, T, H, D] rows, gates [B, T, Hv].
struct Inputs {
  std::vector<__nv_bfloat16> q, k, v;
  std::vector<float> g, beta, h0;
};

Inputs make_inputs() {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal;
  Inputs x;
  auto unit_rows = [&](std::vector<__nv_bfloat16>& out, int heads) {
    out.resize(static_cast<size_t>(B) * T * heads * D);
    for (size_t r = 0; r < out.size() / D; ++r) {
      float row[D], norm = 0.f;
      for (int i = 0; i < D; ++i) row[i] = normal(rng), norm += row[i] * row[i];
      for (int i = 0; i < D; ++i) out[r * D + i] = __float2bfloat16(row[i] / std::sqrt(norm));
    }
  };
  unit_rows(x.q, Hqk);
  unit_rows(x.k, Hqk);
  x.v.resize(static_cast<size_t>(B) * T * Hv * D);
  for (auto& e : x.v) e = __float2bfloat16(normal(rng));
  x.g.resize(static_cast<size_t>(B) * T * Hv);
  x.beta.resize(x.g.size());
  for (size_t i = 0; i < x.g.size(); ++i) {
    const int h = static_cast<int>(i % Hv);
    x.g[i] = h == 0 ? 0.f : h == 1 ? -4.f : -0.05f * std::fabs(normal(rng));
    x.beta[i] = 1.f / (1.f + std::exp(-normal(rng)));
  }
  x.h0.resize(static_cast<size_t>(B) * Hv * D * D);
  for (auto& e : x.h0) e = 0.1f * normal(rng);
  return x;
}

// Tokens [lo, hi) of every batch entry of a [B, T, H, D'] tensor (D' = 1 for gates).
template <typename T_>
std::vector<T_> slice(const std::vector<T_>& all, int heads, int dim, int lo, int hi) {
  std::vector<T_> out;
  for (int b = 0; b < B; ++b)
    for (int t = lo; t < hi; ++t) {
      const size_t at = ((static_cast<size_t>(b) * T + t) * heads) * dim;
      out.insert(out.end(), all.begin() + at, all.begin() + at + static_cast<size_t>(heads) * dim);
    }
  return out;
}

struct Outputs {
  std::vector<__nv_bfloat16> o;  // [B, t, Hv, D]
  std::vector<float> final_state;
};

// The forward of tokens [lo, hi) on the current device: whole (comm == nullptr) or sharded.
Outputs run(const Inputs& x, int lo, int hi, ncclComm_t comm, bool final_vk) {
  using flashgdn::DType;
  const int t = hi - lo;
  flashgdn::ForwardProblem p;
  p.in.shape = {B, t, Hqk, Hv, D, D};
  void* q = upload(slice(x.q, Hqk, D, lo, hi));
  void* k = upload(slice(x.k, Hqk, D, lo, hi));
  void* v = upload(slice(x.v, Hv, D, lo, hi));
  void* g = upload(slice(x.g, Hv, 1, lo, hi));
  void* beta = upload(slice(x.beta, Hv, 1, lo, hi));
  void* h0 = upload(x.h0);
  void* o = nullptr;
  void* final_state = nullptr;
  const size_t o_elems = static_cast<size_t>(B) * t * Hv * D, s_elems = x.h0.size();
  CHECK_CUDA(cudaMalloc(&o, std::max<size_t>(o_elems, 1) * 2));
  CHECK_CUDA(cudaMalloc(&final_state, s_elems * 4));
  CHECK_CUDA(cudaMemset(o, 0xff, std::max<size_t>(o_elems, 1) * 2));  // NaN until written
  CHECK_CUDA(cudaMemset(final_state, 0xff, s_elems * 4));
  p.in.q = ref(q, DType::kBF16, {B, t, Hqk, D});
  p.in.k = ref(k, DType::kBF16, {B, t, Hqk, D});
  p.in.v = ref(v, DType::kBF16, {B, t, Hv, D});
  p.in.g = ref(g, DType::kF32, {B, t, Hv});
  p.in.beta = ref(beta, DType::kF32, {B, t, Hv});
  p.in.initial_state = ref(h0, DType::kF32, {B, Hv, D, D});
  p.o = ref(o, DType::kBF16, {B, t, Hv, D});
  p.final_state = ref(final_state, DType::kF32, {B, Hv, D, D});
  if (final_vk) {  // both states V-first: the initial state is uploaded transposed
    std::vector<float> h0_vk(x.h0.size());
    for (size_t s = 0; s < x.h0.size() / (D * D); ++s)
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) h0_vk[(s * D + j) * D + i] = x.h0[(s * D + i) * D + j];
    CHECK_CUDA(cudaMemcpy(h0, h0_vk.data(), h0_vk.size() * 4, cudaMemcpyHostToDevice));
    p.in.state_layout = flashgdn::StateLayout::kVK;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  size_t bytes = 0;
  flashgdn::Status s = comm == nullptr ? flashgdn::forward_workspace_size(p, &bytes) : [&] {
    int world = 0;
    ncclCommCount(comm, &world);
    return flashgdn::distributed::forward_workspace_size(p, world, &bytes);
  }();
  if (!s.ok()) { std::printf("workspace size: %s\n", s.message().c_str()); std::exit(1); }
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(bytes, 1)));
  s = comm == nullptr ? flashgdn::forward(p, ws, bytes, stream) : flashgdn::distributed::forward(p, comm, ws, bytes, stream);
  if (!s.ok()) { std::printf("forward: %s\n", s.message().c_str()); std::exit(1); }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  Outputs out{download(static_cast<__nv_bfloat16*>(o), o_elems), download(static_cast<float*>(final_state), s_elems)};
  if (final_vk) {  // back to K-major for the comparison
    std::vector<float> kv(out.final_state.size());
    for (size_t st = 0; st < kv.size() / (D * D); ++st)
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) kv[(st * D + i) * D + j] = out.final_state[(st * D + j) * D + i];
    out.final_state = kv;
  }
  for (void* ptr : {q, k, v, g, beta, h0, o, final_state, ws}) cudaFree(ptr);
  cudaStreamDestroy(stream);
  return out;
}

template <typename A, typename B_>
double rel_l2(const std::vector<A>& got, const std::vector<B_>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = static_cast<double>(static_cast<float>(got[i])), b = static_cast<double>(static_cast<float>(want[i]));
    num += (a - b) * (a - b), den += b * b;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main() {
  int devices = 0;
  if (!have_sm90_device()) return kSkipped;
  cudaGetDeviceCount(&devices);
  if (devices < 2) {
    std::printf("%d GPU: the sharded forward needs at least 2: skipped\n", devices);
    return kSkipped;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off (the machine's notes)
  const Inputs x = make_inputs();
  // Slice bounds: unequal; the first slice empty (h0 passes through rank 0); the last empty; and
  // one rank alone (a communicator of one).
  auto even = [](int ranks) {  // T tokens in `ranks` slices
    std::vector<int> b;
    for (int r = 0; r <= ranks; ++r) b.push_back(T * r / ranks);
    return b;
  };
  std::vector<std::vector<int>> cuts{even(devices), even(devices - 1), even(devices - 1), {0, T}};
  cuts[0][1] = T / 3;                  // unequal
  cuts[1].insert(cuts[1].begin(), 0);  // the first slice empty
  cuts[2].push_back(T);                // the last slice empty
  int failures = 0;
  for (const bool vk : {false, true}) {
    CHECK_CUDA(cudaSetDevice(0));
    const Outputs whole = run(x, 0, T, nullptr, vk);
    for (const std::vector<int>& bounds : cuts) {
      const int world = static_cast<int>(bounds.size()) - 1;
      std::vector<ncclComm_t> comms(world);
      if (ncclCommInitAll(comms.data(), world, nullptr) != ncclSuccess) {
        std::printf("ncclCommInitAll failed\n");
        return 1;
      }
      std::vector<Outputs> parts(world);
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
          CHECK_CUDA(cudaSetDevice(r));
          parts[r] = run(x, bounds[r], bounds[r + 1], comms[r], vk);
        });
      for (auto& th : threads) th.join();
      for (auto c : comms) ncclCommDestroy(c);
      std::vector<__nv_bfloat16> o;  // the slices back in token order per batch entry
      for (int b = 0; b < B; ++b)
        for (int r = 0; r < world; ++r) {
          const size_t per_entry = static_cast<size_t>(bounds[r + 1] - bounds[r]) * Hv * D;
          o.insert(o.end(), parts[r].o.begin() + b * per_entry, parts[r].o.begin() + (b + 1) * per_entry);
        }
      const double err_o = rel_l2(o, whole.o);
      double err_s = 0;
      for (int r = 0; r < world; ++r) err_s = std::max(err_s, rel_l2(parts[r].final_state, whole.final_state));
      std::printf("%d GPUs, cuts", world);
      for (int c : bounds) std::printf(" %d", c);
      std::printf(", states %s: o %.2e, final state (worst rank) %.2e\n", vk ? "VK" : "KV", err_o, err_s);
      if (!(err_o <= 1e-2 && err_s <= 1e-2)) ++failures;  // NaN (an unwritten element) fails too
    }
  }
  std::printf(failures ? "FAILED\n" : "OK\n");
  return failures ? 1 : 0;
}
