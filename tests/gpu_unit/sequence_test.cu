// GPU unit test of the chunk lookups of src/kernels/sm90/sequence.cuh: for every chunk id of a launch bound
// (past the last chunk too), locate_chunk_after from every sequence at or before the chunk's own (the hint a
// persistent CTA carries from its previous item) must agree with locate_chunk's binary search: the same
// validity, sequence, batch entry, first token and rows. Cases: varlen with empty sequences and 1-, 63-, 64-,
// 65-token ones (int32 and int64 cu_seqlens), and batch mode. Then the sequence order (order_longest_first,
// in one block of 1024 threads as item_offsets runs it) against a stable sort by decreasing length on the
// host, and the CTAs' items (item_sequence_and_head) of the launchers' grid (launched through launch_per_item
// itself) with that order ((1, Hv, N)), without it and with CP ((N, Hv)): CTA i in dispatch order (x fastest,
// then y, z) must run v-head i % Hv of sequence order[i / Hv], resp. v-head i / N of sequence i % N. Cases:
// ties, empty sequences, N = 1, all lengths equal, N past the block size and at kMaxOrderedSequences, int64
// cu_seqlens; and launch_per_item refusing an order over more than kMaxOrderedSequences sequences (the
// ordered grid's z is the sequence rank) before any launch. Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU
// (skipped).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "kernels/sm90/forward_launch.cuh"
#include "kernels/sm90/sequence.cuh"
#include "sm90_device.h"

namespace {

namespace kern = flashgdn::kern;

// One disagreement, for the host to print.
struct Mismatch {
  int64_t chunk_id, hint, got_seq, want_seq, got_first_token, want_first_token;
  int got_valid, want_valid, got_rows, want_rows;
};
constexpr int kKeep = 5;

// Thread c checks chunk id c against every hint 0 .. its sequence (or 0 .. the last past the end).
__global__ void compare_lookups(const kern::ForwardParams p, int64_t chunk_bound, int* mismatches, Mismatch* kept) {
  const int64_t chunk_id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (chunk_id >= chunk_bound) return;
  kern::ChunkLocation want{};
  const bool valid = kern::locate_chunk(p, chunk_id, want);
  const int64_t last_hint = valid ? want.seq_index : (p.cu_seqlens == nullptr ? p.batch - 1 : p.num_seqs - 1);
  for (int64_t hint = 0; hint <= last_hint; ++hint) {
    kern::ChunkLocation got{};
    const bool got_valid = kern::locate_chunk_after(p, chunk_id, hint, got);
    const bool same = got_valid == valid &&
                      (!valid || (got.seq_index == want.seq_index && got.seq.batch == want.seq.batch &&
                                  got.seq.bos == want.seq.bos && got.seq.eos == want.seq.eos &&
                                  got.first_token == want.first_token && got.rows == want.rows));
    if (same) continue;
    if (const int slot = atomicAdd(mismatches, 1); slot < kKeep)
      kept[slot] = {chunk_id, hint, got.seq_index, want.seq_index, got.first_token, want.first_token,
                    got_valid, valid, got.rows, want.rows};
  }
}

template <typename Index>
int run_case(const char* name, const std::vector<int64_t>& lengths, bool batch_mode) {
  kern::ForwardParams p;
  std::vector<int32_t> chunk_offsets{0};
  std::vector<Index> cu_seqlens{0};
  for (int64_t length : lengths) {
    chunk_offsets.push_back(chunk_offsets.back() + static_cast<int32_t>((length + kern::kChunk - 1) / kern::kChunk));
    cu_seqlens.push_back(static_cast<Index>(cu_seqlens.back() + length));
  }
  void* cu_device = nullptr;
  int32_t* offsets_device = nullptr;
  int* mismatches = nullptr;
  int64_t chunk_bound = 0;
  if (batch_mode) {  // every entry lengths[0] tokens
    p.batch = static_cast<int64_t>(lengths.size());
    p.seqlen = lengths[0];
    p.num_seqs = p.batch;
    chunk_bound = p.batch * ((p.seqlen + kern::kChunk - 1) / kern::kChunk) + 3;
  } else {
    cudaMalloc(&cu_device, cu_seqlens.size() * sizeof(Index));
    cudaMemcpy(cu_device, cu_seqlens.data(), cu_seqlens.size() * sizeof(Index), cudaMemcpyHostToDevice);
    cudaMalloc(&offsets_device, chunk_offsets.size() * sizeof(int32_t));
    cudaMemcpy(offsets_device, chunk_offsets.data(), chunk_offsets.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
    p.batch = 1;
    p.seqlen = static_cast<int64_t>(cu_seqlens.back());
    p.num_seqs = static_cast<int64_t>(lengths.size());
    p.cu_seqlens = cu_device;
    p.cu_seqlens_is_i64 = sizeof(Index) == 8;
    p.chunk_offsets = offsets_device;
    chunk_bound = chunk_offsets.back() + 3;  // a launch bound past the last chunk
  }
  Mismatch* kept_device = nullptr;
  cudaMalloc(&mismatches, sizeof(int));
  cudaMemset(mismatches, 0, sizeof(int));
  cudaMalloc(&kept_device, kKeep * sizeof(Mismatch));
  compare_lookups<<<static_cast<unsigned>((chunk_bound + 127) / 128), 128>>>(p, chunk_bound, mismatches, kept_device);
  int found = -1;
  Mismatch kept[kKeep];
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    std::printf("%s: CUDA error: %s\n", name, cudaGetErrorString(err));
  } else {
    cudaMemcpy(&found, mismatches, sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpy(kept, kept_device, sizeof(kept), cudaMemcpyDeviceToHost);
  }
  for (int i = 0; i < (found < kKeep ? found : kKeep); ++i)
    std::printf("  chunk %lld from sequence %lld: valid %d / %d, sequence %lld / %lld, first token %lld / %lld, "
                "rows %d / %d (got / want)\n",
                static_cast<long long>(kept[i].chunk_id), static_cast<long long>(kept[i].hint), kept[i].got_valid,
                kept[i].want_valid, static_cast<long long>(kept[i].got_seq), static_cast<long long>(kept[i].want_seq),
                static_cast<long long>(kept[i].got_first_token), static_cast<long long>(kept[i].want_first_token),
                kept[i].got_rows, kept[i].want_rows);
  cudaFree(cu_device);
  cudaFree(offsets_device);
  cudaFree(mismatches);
  cudaFree(kept_device);
  std::printf("%s: %lld chunk ids, %d mismatches: %s\n", name, static_cast<long long>(chunk_bound), found,
              found == 0 ? "ok" : "FAIL");
  return found == 0 ? 0 : 1;
}

__global__ void sequence_order(const kern::ForwardParams p, int32_t* order) {
  __shared__ uint64_t keys[kern::kMaxOrderedSequences];
  kern::order_longest_first(p, order, keys);
}

// item_of_cta[linear CTA index, x fastest, then y, then z: the dispatch order] = sequence * Hv + head.
__global__ void record_items(const kern::ForwardParams p, int64_t* item_of_cta) {
  kern::wait_for_previous_grid();
  const kern::ItemIndex at = kern::item_sequence_and_head(p);
  const int64_t linear =
      blockIdx.x + static_cast<int64_t>(gridDim.x) * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
  item_of_cta[linear] = at.x * p.num_v_heads + at.h;
}

// record_items as launch_per_item's Kernel: one warp, no shared memory to speak of.
struct RecordItems {
  struct SharedStorage {
    int unused;
  };
  static constexpr int kThreads = 32;
};

// The CTAs' items of the launchers' grid (forward_launch.cuh launch_per_item, launched through it: (1,
// Hv, N) under the sequence order, else (N, Hv)) against `want` (per linear CTA index); the count of
// mismatches.
int check_items(const kern::ForwardParams& p, const std::vector<int64_t>& want, const char* name, const char* mode) {
  int64_t* items = nullptr;
  cudaMalloc(&items, want.size() * sizeof(int64_t));
  cudaError_t err = kern::launch_per_item<RecordItems>(record_items, p, p.num_seqs, 1, nullptr, items);
  std::vector<int64_t> got(want.size(), -1);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    std::printf("%s (%s): CUDA error: %s\n", name, mode, cudaGetErrorString(err));
  else
    cudaMemcpy(got.data(), items, want.size() * sizeof(int64_t), cudaMemcpyDeviceToHost);
  cudaFree(items);
  int wrong = err == cudaSuccess ? 0 : 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++wrong <= kKeep)
      std::printf("  %s: CTA %zu runs item %lld, want %lld\n", mode, i, static_cast<long long>(got[i]),
                  static_cast<long long>(want[i]));
  }
  return wrong;
}

template <typename Index>
int run_order_case(const char* name, const std::vector<int64_t>& lengths, int num_v_heads) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  std::vector<Index> cu_seqlens{0};
  for (int64_t length : lengths) cu_seqlens.push_back(static_cast<Index>(cu_seqlens.back() + length));
  std::vector<int32_t> want(lengths.size());
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return lengths[a] > lengths[b]; });

  kern::ForwardParams p;
  void* cu_device = nullptr;
  int32_t* order_device = nullptr;
  cudaMalloc(&cu_device, cu_seqlens.size() * sizeof(Index));
  cudaMemcpy(cu_device, cu_seqlens.data(), cu_seqlens.size() * sizeof(Index), cudaMemcpyHostToDevice);
  cudaMalloc(&order_device, lengths.size() * sizeof(int32_t));
  cudaMemset(order_device, 0xFF, lengths.size() * sizeof(int32_t));
  p.batch = 1;
  p.seqlen = static_cast<int64_t>(cu_seqlens.back());
  p.num_seqs = n;
  p.num_v_heads = num_v_heads;
  p.cu_seqlens = cu_device;
  p.cu_seqlens_is_i64 = sizeof(Index) == 8;
  sequence_order<<<1, 1024>>>(p, order_device);
  std::vector<int32_t> got(lengths.size(), -1);
  int wrong = 0;
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    std::printf("%s: CUDA error: %s\n", name, cudaGetErrorString(err));
    wrong = 1;
  } else {
    cudaMemcpy(got.data(), order_device, lengths.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
  }
  for (int64_t r = 0; r < n; ++r) {
    if (got[r] == want[r]) continue;
    if (++wrong <= kKeep)
      std::printf("  rank %lld: sequence %d, want %d\n", static_cast<long long>(r), got[r], want[r]);
  }
  // The CTAs' items: longest first with the order, else (x, y) (also with the order under CP)
  std::vector<int64_t> ordered(static_cast<std::size_t>(n * num_v_heads)), natural(ordered.size());
  for (int64_t i = 0; i < n * num_v_heads; ++i) {
    ordered[i] = int64_t{want[i / num_v_heads]} * num_v_heads + i % num_v_heads;
    natural[i] = (i % n) * num_v_heads + i / n;
  }
  p.sequence_order = order_device;
  wrong += check_items(p, ordered, name, "ordered");
  p.cp_pass = kern::kCpMainPass;
  wrong += check_items(p, natural, name, "CP");
  p.cp_pass = kern::kNoCp;
  p.sequence_order = nullptr;
  wrong += check_items(p, natural, name, "natural");
  cudaFree(cu_device);
  cudaFree(order_device);
  std::printf("%s: %lld sequences x %d v-heads, %d mismatches: %s\n", name, static_cast<long long>(n), num_v_heads,
              wrong, wrong == 0 ? "ok" : "FAIL");
  return wrong == 0 ? 0 : 1;
}

// launch_per_item refuses the ordered grid (1, Hv, N) for N past kMaxOrderedSequences (its z is the
// sequence rank; gridDim.z <= 65535): cudaErrorInvalidValue, before any launch (no sticky error). The
// order is never read there; at the cap it launches (run_order_case's kMaxOrderedSequences case).
int check_order_cap() {
  int32_t* order = nullptr;
  cudaMalloc(&order, sizeof(int32_t));
  kern::ForwardParams p;
  p.batch = 1;
  p.num_seqs = kern::kMaxOrderedSequences + 1;
  p.num_v_heads = 2;
  p.sequence_order = order;
  int64_t* items = nullptr;
  const cudaError_t refused = kern::launch_per_item<RecordItems>(record_items, p, p.num_seqs, 1, nullptr, items);
  const cudaError_t after = cudaDeviceSynchronize();
  cudaFree(order);
  const bool ok = refused == cudaErrorInvalidValue && after == cudaSuccess;
  std::printf("order over kMaxOrderedSequences + 1 sequences: launch_per_item gives %s, then %s: %s\n",
              cudaGetErrorString(refused), cudaGetErrorString(after), ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

// n lengths in [0, range) from a fixed linear congruential sequence (many ties where range << n).
std::vector<int64_t> pseudo_random_lengths(int64_t n, int64_t range) {
  std::vector<int64_t> lengths(static_cast<std::size_t>(n));
  uint32_t state = 12345;
  for (int64_t& length : lengths) {
    state = state * 1664525u + 1013904223u;
    length = static_cast<int64_t>((state >> 8) % static_cast<uint32_t>(range));
  }
  return lengths;
}

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  const std::vector<int64_t> varlen{65, 0, 1, 64, 0, 0, 63, 300, 1, 4133, 0, 129, 64};
  int failures = 0;
  failures += run_case<int32_t>("varlen, int32 cu_seqlens", varlen, false);
  failures += run_case<int64_t>("varlen, int64 cu_seqlens", varlen, false);
  failures += run_case<int32_t>("varlen, one sequence", {1000}, false);
  failures += run_case<int32_t>("batch mode 5 x 200", {200, 200, 200, 200, 200}, true);
  const std::vector<int64_t> ties{65, 0, 1, 64, 0, 0, 63, 300, 1, 4133, 0, 129, 64, 300, 65};
  failures += run_order_case<int32_t>("order: ties and empty sequences", ties, 32);
  failures += run_order_case<int64_t>("order: int64 cu_seqlens", ties, 5);
  failures += run_order_case<int32_t>("order: the bwd table's (16,32) row",
                                      {161, 1928, 3157, 563, 1244, 229, 177, 733}, 32);
  failures += run_order_case<int32_t>("order: one sequence", {1000}, 64);
  failures += run_order_case<int32_t>("order: one empty sequence", {0}, 3);
  failures += run_order_case<int32_t>("order: equal lengths", std::vector<int64_t>(100, 64), 7);
  failures += run_order_case<int32_t>("order: 1025 sequences", pseudo_random_lengths(1025, 3000), 2);
  failures += run_order_case<int32_t>("order: 2049 sequences, many ties", pseudo_random_lengths(2049, 20), 1);
  failures += run_order_case<int32_t>("order: kMaxOrderedSequences",
                                      pseudo_random_lengths(kern::kMaxOrderedSequences, 5000), 3);
  failures += check_order_cap();
  return failures == 0 ? 0 : 1;
}
