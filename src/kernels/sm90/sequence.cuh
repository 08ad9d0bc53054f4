// Device helpers shared by the forward kernels: where a sequence lies, where a chunk lies, which item
// a CTA runs (and the order of the sequences, longest first, that decides it).
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "kernels/sm90/params.h"

namespace flashgdn::kern {

struct SequenceBounds {
  int64_t batch;  // batch index (0 in varlen mode)
  int64_t bos;    // first token of the sequence on the token axis
  int64_t eos;    // one past its last token
};

__device__ __forceinline__ int64_t cu_seqlens_at(const ForwardParams& p, int64_t i) {
  return p.cu_seqlens_is_i64 ? static_cast<const int64_t*>(p.cu_seqlens)[i]
                             : static_cast<const int32_t*>(p.cu_seqlens)[i];
}

__device__ __forceinline__ SequenceBounds sequence_bounds(const ForwardParams& p, int64_t n) {
  if (p.cu_seqlens == nullptr) return {n, 0, p.seqlen};
  return {0, cu_seqlens_at(p, n), cu_seqlens_at(p, n + 1)};
}

// Global id of the first chunk of sequence n (the row of its first chunk in per-chunk tables).
__device__ __forceinline__ int64_t first_chunk(const ForwardParams& p, int64_t n) {
  return p.cu_seqlens == nullptr ? n * ((p.seqlen + kChunk - 1) / kChunk) : p.chunk_offsets[n];
}

struct ChunkLocation {
  SequenceBounds seq;
  int64_t seq_index;    // n: the sequence (varlen) or batch entry
  int64_t first_token;  // token index (within the batch entry) of the chunk's row 0
  int rows;             // valid rows, 1..64
};

// Chunk `chunk` of sequence `seq`.
__device__ __forceinline__ void set_chunk_location(const ForwardParams& p, int64_t seq, int64_t chunk,
                                                   ChunkLocation& where) {
  where.seq = sequence_bounds(p, seq);
  where.seq_index = seq;
  where.first_token = where.seq.bos + chunk * kChunk;
  const int64_t left = where.seq.eos - where.first_token;
  where.rows = static_cast<int>(left < kChunk ? left : kChunk);
}

// Into L1 ahead of a locate_chunk_after(p, later chunk, seq) (varlen): the lines of the entries it reads,
// chunk_offsets[num_seqs], chunk_offsets[seq + 1 ..] and cu_seqlens[seq ..], so that its dependent
// loads hit L1 (no registers held: prefetches have no result).
__device__ __forceinline__ void prefetch_chunk_lookup(const ForwardParams& p, int64_t seq) {
  if (p.cu_seqlens == nullptr) return;
  const auto prefetch = [](const void* at) { asm volatile("prefetch.global.L1 [%0];" ::"l"(at)); };
  prefetch(p.chunk_offsets + p.num_seqs);
  prefetch(p.chunk_offsets + seq + 1);
  prefetch(p.cu_seqlens_is_i64 ? static_cast<const void*>(static_cast<const int64_t*>(p.cu_seqlens) + seq)
                               : static_cast<const void*>(static_cast<const int32_t*>(p.cu_seqlens) + seq));
}

// Global chunk id -> (sequence, chunk); false when the id is past the last chunk (the launch grid
// is an upper bound when the host has no copy of cu_seqlens).
__device__ __forceinline__ bool locate_chunk(const ForwardParams& p, int64_t chunk_id,
                                             ChunkLocation& where) {
  int64_t seq, chunk;
  if (p.cu_seqlens == nullptr) {
    const int64_t per_seq = (p.seqlen + kChunk - 1) / kChunk;
    if (per_seq == 0 || chunk_id >= p.batch * per_seq) return false;
    seq = chunk_id / per_seq;
    chunk = chunk_id % per_seq;
  } else {
    if (chunk_id >= p.chunk_offsets[p.num_seqs]) return false;
    int64_t lo = 0, hi = p.num_seqs;  // largest seq with chunk_offsets[seq] <= chunk_id
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (p.chunk_offsets[mid] <= chunk_id) lo = mid; else hi = mid;
    }
    seq = lo;
    chunk = chunk_id - p.chunk_offsets[seq];
  }
  set_chunk_location(p, seq, chunk, where);
  return true;
}

// locate_chunk for a chunk id at or past one of sequence `seq_hint` (a persistent CTA's ascending
// items): in varlen mode a walk over the sequences from there, typically no step or one, where the
// binary search takes log2(num_seqs) dependent loads.
__device__ __forceinline__ bool locate_chunk_after(const ForwardParams& p, int64_t chunk_id, int64_t seq_hint,
                                                   ChunkLocation& where) {
  if (p.cu_seqlens == nullptr) return locate_chunk(p, chunk_id, where);
  if (chunk_id >= p.chunk_offsets[p.num_seqs]) return false;
  int64_t seq = seq_hint;
  while (p.chunk_offsets[seq + 1] <= chunk_id) ++seq;
  set_chunk_location(p, seq, chunk_id - p.chunk_offsets[seq], where);
  return true;
}

// Segments (CP): sequence i owns ceil(ceil(len_i / 64) / L) segments; first_segment(n) is the id
// of its first. Batch mode needs no table.
__device__ __forceinline__ int64_t segments_per_batch_entry(const ForwardParams& p) {
  return ((p.seqlen + kChunk - 1) / kChunk + p.segment_chunks - 1) / p.segment_chunks;
}
__device__ __forceinline__ int64_t first_segment(const ForwardParams& p, int64_t n) {
  return p.cu_seqlens == nullptr ? n * segments_per_batch_entry(p) : p.segment_offsets[n];
}

// A square state block [128][128] in memory, stored in fp32 or bf16 (computed in fp32): element
// (k, v) at base[k * k_stride + v * v_stride].
struct StateBlock {
  void* base = nullptr;  // null: absent (zero when read, not written)
  bool bf16 = false;
  int64_t k_stride = 0, v_stride = 0;

  __device__ float load(int k, int v) const {
    const int64_t at = k * k_stride + v * v_stride;
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[at]) : static_cast<const float*>(base)[at];
  }
  __device__ void store(int k, int v, float x) const {
    const int64_t at = k * k_stride + v * v_stride;
    if (bf16)
      static_cast<__nv_bfloat16*>(base)[at] = __float2bfloat16_rn(x);
    else
      static_cast<float*>(base)[at] = x;
  }
  // Columns v0 .. v0 + N - 1 of row k (zeros when absent), every load issued before any is used: a
  // copy through these registers costs one memory round trip, where load-store pairs through
  // possibly aliasing pointers run one after another (16 round trips: ~8 us in the CP corrections).
  template <int N>
  __device__ void load_row(int k, int v0, float (&x)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = base == nullptr ? 0.f : load(k, v0 + i);
  }
};

// State (n, h) of a user states tensor (KV or VK layout, any strides; fp32 unless bf16).
__device__ __forceinline__ StateBlock user_state(const void* states, const int64_t (&strides)[4], bool vk,
                                                 int64_t n, int h, bool bf16 = false) {
  if (states == nullptr) return {};
  const int64_t offset = n * strides[0] + h * strides[1];
  void* base = bf16 ? static_cast<void*>(const_cast<__nv_bfloat16*>(static_cast<const __nv_bfloat16*>(states)) + offset)
                    : static_cast<void*>(const_cast<float*>(static_cast<const float*>(states)) + offset);
  return vk ? StateBlock{base, bf16, strides[3], strides[2]} : StateBlock{base, bf16, strides[2], strides[3]};
}
// Sequence n's initial / final state: row n of the states tensor, or its pool slot (none for -1).
__device__ __forceinline__ StateBlock sequence_initial_state(const ForwardParams& p, int64_t n, int h) {
  const int64_t slot = p.initial_state_slots == nullptr ? n : p.initial_state_slots[n];
  return slot < 0 ? StateBlock{}
                  : user_state(p.initial_state, p.initial_state_strides, p.state_vk, slot, h, p.initial_state_bf16);
}
__device__ __forceinline__ StateBlock sequence_final_state(const ForwardParams& p, int64_t n, int h) {
  const int64_t slot = p.final_state_slots == nullptr ? n : p.final_state_slots[n];
  return slot < 0 ? StateBlock{}
                  : user_state(p.final_state, p.final_state_strides, p.state_vk, slot, h, p.final_state_bf16);
}

// Checkpoint j (the state after (j + 1) * checkpoint_chunks chunks) of sequence n.
__device__ __forceinline__ StateBlock checkpoint_state(const ForwardParams& p, int64_t n, int64_t j, int h) {
  const int64_t first = p.cu_seqlens == nullptr ? n * (p.seqlen / (kChunk * p.checkpoint_chunks))
                                                : p.checkpoint_offsets[n];
  return user_state(p.checkpoints, p.checkpoint_strides, p.state_vk, first + j, h);
}

// Block (segment, h) of a contiguous [segment][hv][128][128] workspace buffer.
__device__ __forceinline__ StateBlock segment_state(float* buffer, int num_v_heads, int64_t segment, int h) {
  return {buffer + (segment * num_v_heads + h) * (kHeadDim * kHeadDim), false, kHeadDim, 1};
}

// What one CTA of the fused forward does: which tokens, from which state, into which state.
struct WorkItem {
  bool valid = false;
  int64_t batch = 0;
  int64_t bos = 0, eos = 0;     // tokens processed
  int64_t first_chunk_id = 0;   // global chunk id (per-chunk tables) of the chunk starting at bos
  StateBlock initial;           // null: zero state
  bool initial_identity = false;
  StateBlock final;             // null: not written
  bool zero_v = false;          // V read as zeros (the transition M of a segment)
  bool write_o = false;
  bool write_checkpoints = false;
  int64_t sequence = 0;         // the sequence the tokens belong to
  int64_t chunks_before = 0;    // chunks of that sequence before bos
  bool sequence_end = false;    // the main pass's tokens end their sequence (or shard)
};

// Segment x (CP): its sequence n, index j among the num_segments of n, and its tokens.
struct SegmentLocation {
  bool valid = false;
  int64_t sequence = 0, index = 0, num_segments = 0;
  SequenceBounds seq{};
  int64_t bos = 0, eos = 0;

  __device__ bool last() const { return index == num_segments - 1; }
};

__device__ __forceinline__ SegmentLocation locate_segment(const ForwardParams& p, int64_t x) {
  SegmentLocation at;
  if (p.cu_seqlens == nullptr) {
    at.num_segments = segments_per_batch_entry(p);
    if (at.num_segments == 0 || x >= p.batch * at.num_segments) return at;
    at.sequence = x / at.num_segments;
    at.index = x % at.num_segments;
  } else {
    if (x >= p.segment_offsets[p.num_seqs]) return at;
    int64_t lo = 0, hi = p.num_seqs;  // largest n with segment_offsets[n] <= x
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (p.segment_offsets[mid] <= x) lo = mid; else hi = mid;
    }
    at.sequence = lo;
    at.index = x - p.segment_offsets[lo];
    at.num_segments = p.segment_offsets[lo + 1] - p.segment_offsets[lo];
  }
  at.valid = true;
  at.seq = sequence_bounds(p, at.sequence);
  // Balanced cut: the sequence's C chunks in num_segments = ceil(C / L) segments of floor(C / n) or
  // floor(C / n) + 1 chunks, the longer first (src/plan/cp_plan.h): no short tail segment.
  // 32-bit division (a sequence has < 2^31 chunks): the 64-bit one spills in the register-bound
  // fused kernels.
  const int32_t chunks = static_cast<int32_t>((at.seq.eos - at.seq.bos + kChunk - 1) / kChunk);
  const int32_t segments = static_cast<int32_t>(at.num_segments), index = static_cast<int32_t>(at.index);
  const int32_t base = chunks / segments, longer = chunks - base * segments;
  const int64_t first = int64_t{index} * base + (index < longer ? index : longer);
  const int64_t end = at.seq.bos + (first + base + (index < longer ? 1 : 0)) * kChunk;
  at.bos = at.seq.bos + first * kChunk;
  at.eos = end < at.seq.eos ? end : at.seq.eos;
  return at;
}

// Sequences longest first into order[0 .. num_seqs) (ForwardParams::sequence_order; varlen, num_seqs <=
// kMaxOrderedSequences): ties by index, so the order is a pure function of the lengths. A bitonic sort
// of the keys (INT32_MAX - length) << 32 | index, ascending, padded with the largest key to a power of
// two, in `keys` (shared memory); the whole block calls it (it synchronizes).
__device__ __forceinline__ void order_longest_first(const ForwardParams& p, int32_t* order,
                                                    uint64_t (&keys)[kMaxOrderedSequences]) {
  const int n = static_cast<int>(p.num_seqs);
  int size = 1;
  while (size < n) size *= 2;
  for (int i = threadIdx.x; i < size; i += blockDim.x) {
    uint64_t key = ~uint64_t{0};
    if (i < n) {
      const int64_t length = cu_seqlens_at(p, i + 1) - cu_seqlens_at(p, i);
      const int64_t clamped = length < 0 ? 0 : length > INT32_MAX ? INT32_MAX : length;
      key = static_cast<uint64_t>(INT32_MAX - clamped) << 32 | static_cast<uint32_t>(i);
    }
    keys[i] = key;
  }
  __syncthreads();
  for (int merged = 2; merged <= size; merged *= 2) {  // runs of `merged` keys, alternately ascending
    for (int step = merged / 2; step > 0; step /= 2) {  // and descending, merged by compare-exchanges
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int partner = i ^ step;
        if (partner <= i) continue;
        const uint64_t a = keys[i], b = keys[partner];
        if ((a > b) == ((i & merged) == 0)) {
          keys[i] = b;
          keys[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) order[i] = static_cast<int32_t>(keys[i] & 0xffffffffu);
}

// Whether a per-item kernel takes the sequences longest first (p.sequence_order, varlen without CP):
// then its grid is (1, Hv, N), CTA (0, h, r) running v-head h of sequence sequence_order[r], so that the
// hardware, which dispatches CTAs x fastest, then y, then z, starts all v-heads of the longest sequence
// first, then the next (longest-processing-time first); else (N or segments, Hv[, z]), CTA (x, h[, z]).
// The v-head is blockIdx.y either way (a special register the kernels re-read, not a value they keep),
// and every output is indexed by (x, h) as before.
__host__ __device__ __forceinline__ bool heads_fastest(const ForwardParams& p) {
  return p.sequence_order != nullptr && p.cp_pass == kNoCp;
}
// The item (sequence or segment x, v-head h) of this CTA.
struct ItemIndex {
  int64_t x;
  int h;
};
__device__ __forceinline__ ItemIndex item_sequence_and_head(const ForwardParams& p) {
  // the rank's sequence as an unsigned 32-bit value, like blockIdx.x: its 64-bit uses need no high word
  const uint32_t x = heads_fastest(p) ? static_cast<uint32_t>(p.sequence_order[blockIdx.z]) : blockIdx.x;
  return {x, static_cast<int>(blockIdx.y)};
}

// Work item of CTA (x, h, z). Without CP, x is a sequence. With CP, x is a segment j of sequence n:
//   state pass, z = 0: j not last; tokens = the trailing window of the segment (the whole segment
//                      when it has none), from h0 for an exact first segment, else from zero;
//                      end state -> segment_ends[x]
//   state pass, z = 1: only for j > 0 where a correction needs M_j (no forward window and j < last;
//                      no backward window, j < last or transition_for_last): the whole segment with
//                      V = 0 from the identity, i.e. the transition M_j -> segment_transitions[x]
//   (p.shard: z = 0 for every j, from zero; z = 1 for every j without a forward or a backward window;
//    p.segment_starts_given: no z = 0 items, z = 1 only where the backward's window is missing and the
//    forward's is not; p.cache_transitions: z = 1 for the last segment too where its window is missing)
//   main pass:         the segment from S_j = segment_starts[x] (h0 or zero for j = 0, copied there
//                      by the correction, so that final_state may alias initial_state); o; the
//                      final state of the last segment -> final_state[n]
__device__ __forceinline__ WorkItem work_item(const ForwardParams& p, int64_t x, int h, int z) {
  WorkItem item;
  if (p.cp_pass == kNoCp) {
    const SequenceBounds seq = sequence_bounds(p, x);
    item.valid = true;
    item.batch = seq.batch;
    item.bos = seq.bos;
    item.eos = seq.eos;
    item.first_chunk_id = seq.eos > seq.bos ? first_chunk(p, x) : 0;
    item.initial = sequence_initial_state(p, x, h);
    item.final = sequence_final_state(p, x, h);
    item.write_o = p.o != nullptr;
    item.write_checkpoints = p.checkpoints != nullptr;
    item.sequence = x;
    item.sequence_end = true;
    return item;
  }
  const SegmentLocation at = locate_segment(p, x);
  if (!at.valid) return item;
  const int64_t n = at.sequence;
  item.batch = at.seq.batch;
  item.eos = at.eos;
  if (p.cp_pass == kCpStatePass) {
    // With the segment states given (the forward's CP cache) no S*_j runs, and of the reverse
    // correction's M_j only those the forward did not form (where its window was not missing).
    if (z == 0 && (p.segment_starts_given || (at.last() && !p.shard))) return item;
    const int32_t window = p.window_chunks[x * p.num_v_heads + h];
    if (z == 1) {  // M_j where the forward correction, the backward's reverse correction or the cache needs it
      const bool grad_exact = p.grad_window_chunks != nullptr && p.grad_window_chunks[x * p.num_v_heads + h] == 0;
      const bool grad_needs = grad_exact && (!at.last() || p.transition_for_last);
      const bool needed = p.shard                  ? window == 0 || grad_exact
                          : p.segment_starts_given ? grad_needs && window != 0
                                                   : (window == 0 && (!at.last() || p.cache_transitions)) || grad_needs;
      if ((at.index == 0 && !p.shard) || !needed) return item;
    }
    item.valid = true;
    // The window's chunks are the segment's last ones, counted on the chunk grid from its start
    // (only a last segment, which p.shard runs, can end in a partial chunk).
    const int64_t chunks = (at.eos - at.bos + kChunk - 1) / kChunk;
    item.bos = z == 0 && window != 0 ? at.bos + (chunks - window) * kChunk : at.bos;
    if (z == 0) {
      if (window == 0 && at.index == 0 && !p.shard) item.initial = sequence_initial_state(p, n, h);
      item.final = segment_state(p.segment_ends, p.num_v_heads, x, h);
    } else {
      item.initial_identity = true;
      item.zero_v = true;
      item.final = segment_state(p.segment_transitions, p.num_v_heads, x, h);
    }
  } else {
    item.valid = true;
    item.bos = at.bos;
    item.initial = segment_state(p.segment_starts, p.num_v_heads, x, h);
    if (at.last()) item.final = sequence_final_state(p, n, h);
    item.sequence_end = at.last();
    item.write_o = p.o != nullptr;
    item.write_checkpoints = p.checkpoints != nullptr;
  }
  item.sequence = n;
  item.chunks_before = (item.bos - at.seq.bos) / kChunk;
  item.first_chunk_id = first_chunk(p, n) + item.chunks_before;
  return item;
}

// This CTA's work item (item_sequence_and_head, then work_item, which reads z only with CP: there the
// state pass's S* / M; under the sequence order, without CP, blockIdx.z is the rank).
__device__ __forceinline__ WorkItem block_work_item(const ForwardParams& p) {
  const ItemIndex at = item_sequence_and_head(p);
  return work_item(p, at.x, at.h, blockIdx.z);
}

template <typename T>
__device__ __forceinline__ const T* row_ptr(const void* base, const RowStrides& s, int64_t b,
                                            int64_t t, int64_t h) {
  return static_cast<const T*>(base) + b * s.batch + t * s.token + h * s.head;
}

// beta's element index of (b, t, h); its dtype is p.beta_is_bf16's (bf16) or fp32.
__device__ __forceinline__ int64_t beta_index(const ForwardParams& p, int64_t b, int64_t t, int64_t h) {
  return b * p.beta_strides.batch + t * p.beta_strides.token + h * p.beta_strides.head;
}
// beta of token t (batch entry b) of v-head h, bf16 or fp32 as the caller passed it.
__device__ __forceinline__ float load_beta(const ForwardParams& p, int64_t b, int64_t t, int64_t h) {
  const int64_t at = beta_index(p, b, t, h);
  return p.beta_is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[at])
                        : static_cast<const float*>(p.beta)[at];
}

}  // namespace flashgdn::kern
