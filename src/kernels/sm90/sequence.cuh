// Device helpers shared by the forward kernels: where a sequence lies, where a chunk lies.
#pragma once

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
  int64_t first_token;  // token index (within the batch entry) of the chunk's row 0
  int rows;             // valid rows, 1..64
};

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
  where.seq = sequence_bounds(p, seq);
  where.first_token = where.seq.bos + chunk * kChunk;
  const int64_t left = where.seq.eos - where.first_token;
  where.rows = static_cast<int>(left < kChunk ? left : kChunk);
  return true;
}

template <typename T>
__device__ __forceinline__ const T* row_ptr(const void* base, const RowStrides& s, int64_t b,
                                            int64_t t, int64_t h) {
  return static_cast<const T*>(base) + b * s.batch + t * s.token + h * s.head;
}

}  // namespace flashgdn::kern
