#include "plan/chunk_table.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace flashgdn::plan {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

Status invalid(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

std::string entry(size_t i, int64_t value) {
  return "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(value);
}

// Appends the chunks of one sequence of `length` tokens starting at `first_token`.
void append_sequence(ChunkTable& table, int64_t sequence, int64_t batch, int64_t first_token,
                     int64_t length) {
  const int64_t chunks = num_chunks_of(length);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t offset = c * kChunkSize;
    const int64_t rows = length - offset < kChunkSize ? length - offset : kChunkSize;
    table.chunks.push_back({static_cast<int32_t>(sequence), static_cast<int32_t>(c),
                            static_cast<int32_t>(batch), static_cast<int32_t>(rows),
                            first_token + offset});
  }
  table.first_chunk.push_back(table.num_chunks());
}

}  // namespace

Status validate_cu_seqlens(std::span<const int64_t> cu_seqlens, int64_t num_tokens) {
  if (cu_seqlens.empty()) return invalid("cu_seqlens is empty: it needs num_seqs + 1 >= 1 offsets");
  if (static_cast<int64_t>(cu_seqlens.size()) - 1 > kMaxInt32)
    return invalid("cu_seqlens describes " + std::to_string(cu_seqlens.size() - 1) +
                   " sequences, more than int32 can index");
  if (cu_seqlens[0] != 0) return invalid(entry(0, cu_seqlens[0]) + ", but it must be 0");
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    if (cu_seqlens[i] < 0) return invalid(entry(i, cu_seqlens[i]) + " is negative");
    if (cu_seqlens[i] < cu_seqlens[i - 1])
      return invalid("cu_seqlens must be non-decreasing, but " + entry(i, cu_seqlens[i]) + " < " +
                     entry(i - 1, cu_seqlens[i - 1]));
    if (num_chunks_of(cu_seqlens[i] - cu_seqlens[i - 1]) > kMaxInt32)
      return invalid("sequence " + std::to_string(i - 1) + " has " +
                     std::to_string(cu_seqlens[i] - cu_seqlens[i - 1]) +
                     " tokens, more chunks than int32 can index");
  }
  if (cu_seqlens.back() > num_tokens)
    return invalid(entry(cu_seqlens.size() - 1, cu_seqlens.back()) +
                   " exceeds the number of tokens T = " + std::to_string(num_tokens));
  return Status::ok_status();
}

std::vector<int64_t> sequence_lengths(std::span<const int64_t> cu_seqlens) {
  std::vector<int64_t> lengths;
  for (size_t i = 1; i < cu_seqlens.size(); ++i)
    lengths.push_back(cu_seqlens[i] - cu_seqlens[i - 1]);
  return lengths;
}

ChunkTable varlen_chunk_table(std::span<const int64_t> cu_seqlens) {
  const Status status = validate_cu_seqlens(cu_seqlens, cu_seqlens.empty() ? 0 : cu_seqlens.back());
  if (!status.ok()) throw std::invalid_argument(status.message());
  ChunkTable table;
  table.chunks.reserve(static_cast<size_t>(num_chunks_of(cu_seqlens.back()) + cu_seqlens.size()));
  table.first_chunk.push_back(0);
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i)
    append_sequence(table, static_cast<int64_t>(i), 0, cu_seqlens[i],
                    cu_seqlens[i + 1] - cu_seqlens[i]);
  return table;
}

ChunkTable batch_chunk_table(int64_t batch, int64_t seqlen) {
  if (batch < 0 || batch > kMaxInt32)
    throw std::invalid_argument("batch = " + std::to_string(batch) + " is outside [0, 2^31)");
  if (seqlen < 0 || num_chunks_of(seqlen) > kMaxInt32)
    throw std::invalid_argument("seqlen = " + std::to_string(seqlen) +
                                " is negative or has more chunks than int32 can index");
  ChunkTable table;
  table.chunks.reserve(static_cast<size_t>(batch * num_chunks_of(seqlen)));
  table.first_chunk.push_back(0);
  for (int64_t b = 0; b < batch; ++b) append_sequence(table, b, b, 0, seqlen);
  return table;
}

}  // namespace flashgdn::plan
