// Small forward kernels around the main two:
//   l2norm_rows     one warp per 128-vector: x / sqrt(sum(x^2) + 1e-6) into a contiguous copy
//   item_offsets    one block: exclusive prefix sum over the sequences of their chunks or CP
//                   segments (varlen); with the chunk table also the sequences longest first
//                   (ForwardParams::sequence_order, order_longest_first in sequence.cuh)
//   zero_padding    grid-stride: o rows of tokens past cu_seqlens[N] set to zero (varlen)
//   chunk_gates     one block per (chunk, 32 v-heads): the chunk's gate records (chunk_gates.cuh)
//                   for the forward that forms A_r itself (fused_forward_inv.cuh)
#include <cuda_runtime.h>

#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {
namespace {

template <typename Elem>
__global__ void l2norm_rows_kernel(const Elem* src, int64_t batch, int64_t tokens, int64_t heads,
                                   int64_t stride_batch, int64_t stride_token, int64_t stride_head,
                                   Elem* dst) {
  wait_for_previous_grid();
  release_next_grid();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= batch * tokens * heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t h = row % heads, t = (row / heads) % tokens, b = row / (heads * tokens);
  const Elem* in = src + b * stride_batch + t * stride_token + h * stride_head + 4 * lane;
  float x[4], sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[i] = to_float(in[i]);
    sum += x[i] * x[i];
  }
  sum = warp_sum(sum);
  const float inv = rsqrtf(sum + 1e-6f);
  Elem* out = dst + row * kHeadDim + 4 * lane;
  store_pair(out, x[0] * inv, x[1] * inv);
  store_pair(out + 2, x[2] * inv, x[3] * inv);
}

// offsets[i] = sum_{j < i} ceil(ceil(len_j / 64) / chunks_per_item): chunks (1) or CP segments;
// with whole_items, sum_{j < i} floor(len_j / (64 chunks_per_item)): state checkpoints. With `second`
// (a varlen CP call's segment table, computed in the chunk table's launch), also second[i] = sum_{j < i}
// ceil(ceil(len_j / 64) / second_chunks). With `order` (num_seqs <= kMaxOrderedSequences), the sequences
// longest first there.
__global__ void item_offsets_kernel(const ForwardParams p, int32_t* offsets, int64_t chunks_per_item,
                                    bool whole_items, int32_t* second, int64_t second_chunks, int32_t* order) {
  wait_for_previous_grid();
  release_next_grid();
  __shared__ int2 carry;
  if (threadIdx.x == 0) carry = make_int2(0, 0);
  __syncthreads();
  for (int64_t base = 0; base <= p.num_seqs; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    int2 items = make_int2(0, 0);  // items of sequence i - 1 (exclusive prefix): offsets', second's
    if (i >= 1 && i <= p.num_seqs) {
      const int64_t length = cu_seqlens_at(p, i) - cu_seqlens_at(p, i - 1);
      const int64_t seq_chunks = (length + kChunk - 1) / kChunk;
      items.x = static_cast<int32_t>(whole_items ? length / (kChunk * chunks_per_item)
                                                 : (seq_chunks + chunks_per_item - 1) / chunks_per_item);
      if (second != nullptr) items.y = static_cast<int32_t>((seq_chunks + second_chunks - 1) / second_chunks);
    }
    // Block-wide inclusive scan of both counts (Hillis-Steele through shared memory).
    __shared__ int2 scan[1024];
    scan[threadIdx.x] = items;
    __syncthreads();
    for (int offset = 1; offset < static_cast<int>(blockDim.x); offset *= 2) {
      const int2 add = threadIdx.x >= static_cast<unsigned>(offset) ? scan[threadIdx.x - offset] : make_int2(0, 0);
      __syncthreads();
      scan[threadIdx.x].x += add.x;
      scan[threadIdx.x].y += add.y;
      __syncthreads();
    }
    if (i <= p.num_seqs) {
      offsets[i] = carry.x + scan[threadIdx.x].x;
      if (second != nullptr) second[i] = carry.y + scan[threadIdx.x].y;
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) {
      carry.x += scan[threadIdx.x].x;
      carry.y += scan[threadIdx.x].y;
    }
    __syncthreads();
  }
  if (order != nullptr && p.num_seqs <= kMaxOrderedSequences) {
    __shared__ uint64_t keys[kMaxOrderedSequences];
    order_longest_first(p, order, keys);
  }
}

template <typename Elem>
__global__ void zero_padding_kernel(const ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  const int64_t first = cu_seqlens_at(p, p.num_seqs);
  const int64_t vectors = (p.seqlen - first) * p.num_v_heads * (kHeadDim / 8);  // 16-byte vectors
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < vectors;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t vec = e % (kHeadDim / 8), h = (e / (kHeadDim / 8)) % p.num_v_heads;
    const int64_t t = first + e / (kHeadDim / 8 * p.num_v_heads);
    Elem* out = static_cast<Elem*>(p.o) + t * p.o_strides.token + h * p.o_strides.head + vec * 8;
    *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0);
  }
}

// Grid (max_chunks, ceil(Hv / 32)), block 256: the chunk's g and beta of 32 v-heads read row by row
// (a token's 32 heads are contiguous where the head stride is 1: one 128-byte line a warp load, where
// a warp a (chunk, head) touched a line a token), transposed through shared memory, then warp w
// writes the records of heads w, w + 8, w + 16, w + 24 of the block.
constexpr int kGateHeads = 32, kGateThreads = 256;
__global__ void __launch_bounds__(kGateThreads) chunk_gates_kernel(const ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  __shared__ float g_rows[kGateHeads][kChunk + 1], beta_rows[kGateHeads][kChunk + 1];  // [head][row]
  ChunkLocation where;
  if (!locate_chunk(p, blockIdx.x, where)) return;
  const int h0 = kGateHeads * blockIdx.y;
  const int heads = min(kGateHeads, p.num_v_heads - h0);
  const int64_t b = where.seq.batch;
  constexpr int kPerThread = kChunk * kGateHeads / kGateThreads;
  float g[kPerThread], beta[kPerThread];  // all loads issued before any store
  const int head = threadIdx.x % kGateHeads;
  const auto row_of = [](int i) { return (static_cast<int>(threadIdx.x) + kGateThreads * i) / kGateHeads; };
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int row = row_of(i);
    g[i] = beta[i] = 0.f;
    if (row < where.rows && head < heads) {
      const int64_t t = where.first_token + row;
      g[i] = p.g[b * p.g_strides.batch + t * p.g_strides.token + (h0 + head) * p.g_strides.head];
      beta[i] = load_beta(p, b, t, h0 + head);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    g_rows[head][row_of(i)] = g[i];
    beta_rows[head][row_of(i)] = beta[i];
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int h = threadIdx.x / 32; h < heads; h += kGateThreads / 32) {
    ChunkGates gates;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      gates.g[i] = kLog2e * g_rows[h][2 * lane + i];
      gates.beta[i] = beta_rows[h][2 * lane + i];
    }
    float* record = p.chunk_gates + (blockIdx.x * static_cast<int64_t>(p.num_v_heads) + h0 + h) * 2 * kChunk;
    store_chunk_gates(record, record + kChunk, gates);
  }
}

}  // namespace

cudaError_t launch_chunk_gates(const ForwardParams& p, cudaStream_t stream) {
  if (p.max_chunks == 0 || p.num_v_heads == 0) return cudaSuccess;
  return launch_kernel(chunk_gates_kernel,
                       dim3(static_cast<unsigned>(p.max_chunks), (p.num_v_heads + kGateHeads - 1) / kGateHeads),
                       kGateThreads, 0, stream, p);
}

template <ElemKind E>
cudaError_t launch_l2norm_rows(const void* src, int64_t batch, int64_t tokens, int64_t heads,
                               int64_t stride_batch, int64_t stride_token, int64_t stride_head,
                               void* dst, cudaStream_t stream) {
  using Elem = ElemType<E>;
  const int64_t rows = batch * tokens * heads;
  if (rows == 0) return cudaSuccess;
  constexpr int kRowsPerBlock = 8;
  return launch_kernel(l2norm_rows_kernel<Elem>, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                       32 * kRowsPerBlock, 0, stream, static_cast<const Elem*>(src), batch, tokens, heads,
                       stride_batch, stride_token, stride_head, static_cast<Elem*>(dst));
}
template cudaError_t launch_l2norm_rows<ElemKind::kBF16>(const void*, int64_t, int64_t, int64_t, int64_t,
                                                         int64_t, int64_t, void*, cudaStream_t);
template cudaError_t launch_l2norm_rows<ElemKind::kF16>(const void*, int64_t, int64_t, int64_t, int64_t,
                                                        int64_t, int64_t, void*, cudaStream_t);

cudaError_t launch_chunk_offsets(const ForwardParams& p, int32_t* segment_offsets, int64_t segment_chunks,
                                 int32_t* sequence_order, cudaStream_t stream) {
  return launch_kernel(item_offsets_kernel, 1, 1024, 0, stream, p, p.chunk_offsets, int64_t{1}, false,
                       segment_offsets, segment_chunks, sequence_order);
}

cudaError_t launch_checkpoint_offsets(const ForwardParams& p, cudaStream_t stream) {
  return launch_kernel(item_offsets_kernel, 1, 1024, 0, stream, p, p.checkpoint_offsets, p.checkpoint_chunks, true,
                       static_cast<int32_t*>(nullptr), int64_t{0}, static_cast<int32_t*>(nullptr));
}

cudaError_t launch_zero_padding(const ForwardParams& p, ElemKind elem, cudaStream_t stream) {
  const int64_t vectors = p.seqlen * p.num_v_heads * (kHeadDim / 8);  // bound: padding <= seqlen
  if (vectors == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((vectors + 255) / 256, 1024));
  return launch_kernel(elem == ElemKind::kBF16 ? zero_padding_kernel<__nv_bfloat16> : zero_padding_kernel<__half>,
                       blocks, 256, 0, stream, p);
}

}  // namespace flashgdn::kern
