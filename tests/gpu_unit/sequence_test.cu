// GPU unit test of the chunk lookups of src/kernels/sm90/sequence.cuh: for every chunk id of a
// launch bound (past the last chunk too), locate_chunk_after from every sequence at or before the
// chunk's own (the hint a persistent CTA carries from its previous item) must agree with
// locate_chunk's binary search: the same validity, sequence, batch entry, first token and rows. Cases:
// varlen with empty sequences and 1-, 63-, 64-, 65-token ones (int32 and int64 cu_seqlens), and
// batch mode. Exit codes: 0 pass, 1 mismatch, 77 no sm_90 GPU (skipped).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

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

}  // namespace

int main() {
  if (!have_sm90_device()) return kSkipped;
  const std::vector<int64_t> varlen{65, 0, 1, 64, 0, 0, 63, 300, 1, 4133, 0, 129, 64};
  int failures = 0;
  failures += run_case<int32_t>("varlen, int32 cu_seqlens", varlen, false);
  failures += run_case<int64_t>("varlen, int64 cu_seqlens", varlen, false);
  failures += run_case<int32_t>("varlen, one sequence", {1000}, false);
  failures += run_case<int32_t>("batch mode 5 x 200", {200, 200, 200, 200, 200}, true);
  return failures == 0 ? 0 : 1;
}
