// Chunk tables: the flat list of 64-token chunks that the chunked kernels iterate over.
//
// A sequence of n tokens has ceil(n / kChunkSize) chunks; chunk c covers tokens
// [c * kChunkSize, min((c + 1) * kChunkSize, n)) of the sequence, so every chunk has
// 1..kChunkSize valid rows and only a sequence's last chunk may be partial. An empty sequence has
// no chunk but keeps its index (sequence numbering is never compacted).
//
// Two layouts of the token axes (include/flashgdn/problem.h):
//   varlen: batch == 1, sequence i is tokens [cu_seqlens[i], cu_seqlens[i+1]) of the packed axis;
//           a chunk's first_token is that global packed offset and its batch index is 0.
//   batch:  `batch` sequences of `seqlen` tokens; sequence b is batch entry b, a chunk's
//           first_token is its offset inside the entry and its batch index is b.
// The table lists chunks sequence-major (sequence 0's chunks in order, then sequence 1's, ...);
// first_chunk[i] is the table row of sequence i's chunk 0 (CSR offsets, num_sequences + 1 of them).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flashgdn/types.h"

namespace flashgdn::plan {

inline constexpr int kChunkSize = 64;  // C: tokens per chunk of the chunked form

inline constexpr int64_t num_chunks_of(int64_t tokens) {
  return (tokens + kChunkSize - 1) / kChunkSize;
}

struct ChunkEntry {
  int32_t sequence = 0;     // sequence index (varlen: position in cu_seqlens; batch: batch index)
  int32_t chunk = 0;        // chunk index within the sequence
  int32_t batch = 0;        // batch index (batch mode), 0 in varlen mode
  int32_t rows = 0;         // valid rows, 1..kChunkSize
  int64_t first_token = 0;  // varlen: global packed token offset; batch: offset inside the entry
};

struct ChunkTable {
  std::vector<ChunkEntry> chunks;    // sequence-major
  std::vector<int64_t> first_chunk;  // num_sequences + 1 entries; sequence i owns rows
                                     // [first_chunk[i], first_chunk[i + 1])

  int64_t num_sequences() const { return static_cast<int64_t>(first_chunk.size()) - 1; }
  int64_t num_chunks() const { return static_cast<int64_t>(chunks.size()); }
  int64_t num_chunks_of_sequence(int64_t sequence) const {
    return first_chunk[sequence + 1] - first_chunk[sequence];
  }
};

// Checks host cu_seqlens (num_seqs + 1 offsets) against a packed axis of `num_tokens` tokens:
// at least one offset, cu_seqlens[0] == 0, no negative offset, non-decreasing,
// cu_seqlens[num_seqs] <= num_tokens, and num_seqs and every sequence's chunk count fit in int32.
// The message of a failure names the first offending entry and its value.
Status validate_cu_seqlens(std::span<const int64_t> cu_seqlens, int64_t num_tokens);

// Sequence lengths cu_seqlens[i + 1] - cu_seqlens[i] (cu_seqlens valid as above).
std::vector<int64_t> sequence_lengths(std::span<const int64_t> cu_seqlens);

// Varlen chunk table. Throws std::invalid_argument with validate_cu_seqlens's message when
// cu_seqlens is invalid (checked against num_tokens = cu_seqlens.back()).
ChunkTable varlen_chunk_table(std::span<const int64_t> cu_seqlens);

// Batch-mode chunk table of `batch` sequences of `seqlen` tokens. Throws std::invalid_argument when
// batch or seqlen is negative or does not fit the table's int32 fields.
ChunkTable batch_chunk_table(int64_t batch, int64_t seqlen);

}  // namespace flashgdn::plan
