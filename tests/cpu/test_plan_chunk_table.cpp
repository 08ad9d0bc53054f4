// Chunk tables (src/plan/chunk_table.h): every token of every sequence lies in exactly one chunk,
// rows sum to the lengths, empty sequences own no chunk but keep their index, and bad host
// cu_seqlens are rejected with a message naming the offending entry.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "plan/chunk_table.h"
#include "test_util.h"

namespace flashgdn::plan {
namespace {

using flashgdn::testing::announced_seed;
using flashgdn::testing::Rng;

std::vector<int64_t> cu_from_lengths(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (const int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

// Checks `table` against sequences i of lengths[i] starting at starts[i] of batch entry
// batches[i]: coverage of every token exactly once, in order, with correct rows and indices.
void expect_table_covers(const ChunkTable& table, const std::vector<int64_t>& starts,
                         const std::vector<int64_t>& lengths, const std::vector<int64_t>& batches) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  ASSERT_EQ(table.num_sequences(), n);
  ASSERT_EQ(table.first_chunk.front(), 0);
  ASSERT_EQ(table.first_chunk.back(), table.num_chunks());
  int64_t total_rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t expected_chunks = (lengths[i] + 63) / 64;
    ASSERT_EQ(table.num_chunks_of_sequence(i), expected_chunks) << "sequence " << i;
    int64_t next_token = starts[i];  // each chunk starts where the previous one ended
    int64_t rows = 0;
    for (int64_t r = table.first_chunk[i]; r < table.first_chunk[i + 1]; ++r) {
      const ChunkEntry& e = table.chunks[r];
      ASSERT_EQ(e.sequence, i);
      ASSERT_EQ(e.chunk, r - table.first_chunk[i]);
      ASSERT_EQ(e.batch, batches[i]);
      ASSERT_EQ(e.first_token, next_token) << "sequence " << i << " chunk " << e.chunk;
      ASSERT_GE(e.rows, 1);
      ASSERT_LE(e.rows, kChunkSize);
      // Only the last chunk of a sequence may be partial.
      if (r + 1 < table.first_chunk[i + 1]) {
        ASSERT_EQ(e.rows, kChunkSize);
      }
      next_token += e.rows;
      rows += e.rows;
    }
    ASSERT_EQ(rows, lengths[i]) << "sequence " << i;
    total_rows += rows;
  }
  int64_t expected_total = 0;
  for (const int64_t length : lengths) expected_total += length;
  EXPECT_EQ(total_rows, expected_total);
}

void expect_varlen_table_covers(const std::vector<int64_t>& lengths) {
  const std::vector<int64_t> cu = cu_from_lengths(lengths);
  const ChunkTable table = varlen_chunk_table(cu);
  const std::vector<int64_t> starts(cu.begin(), cu.end() - 1);
  expect_table_covers(table, starts, lengths, std::vector<int64_t>(lengths.size(), 0));
  // Packed-axis coverage: each token of [0, cu[N]) in exactly one chunk.
  std::vector<int> hits(static_cast<size_t>(cu.back()), 0);
  for (const ChunkEntry& e : table.chunks)
    for (int64_t t = e.first_token; t < e.first_token + e.rows; ++t) ++hits[t];
  for (size_t t = 0; t < hits.size(); ++t) ASSERT_EQ(hits[t], 1) << "token " << t;
}

TEST(PlanChunkTable, EdgeLengths) {
  const std::vector<int64_t> lengths{0, 1, 63, 64, 65, 127, 128, 129, int64_t{1} << 20, 0};
  expect_varlen_table_covers(lengths);
  const ChunkTable table = varlen_chunk_table(cu_from_lengths(lengths));
  EXPECT_EQ(table.num_chunks_of_sequence(0), 0);
  EXPECT_EQ(table.num_chunks_of_sequence(1), 1);
  EXPECT_EQ(table.chunks[table.first_chunk[1]].rows, 1);
  EXPECT_EQ(table.chunks[table.first_chunk[2]].rows, 63);
  EXPECT_EQ(table.num_chunks_of_sequence(3), 1);
  EXPECT_EQ(table.chunks[table.first_chunk[3]].rows, 64);
  EXPECT_EQ(table.num_chunks_of_sequence(4), 2);
  EXPECT_EQ(table.chunks[table.first_chunk[4] + 1].rows, 1);
  EXPECT_EQ(table.num_chunks_of_sequence(5), 2);
  EXPECT_EQ(table.chunks[table.first_chunk[5] + 1].rows, 63);
  EXPECT_EQ(table.num_chunks_of_sequence(6), 2);
  EXPECT_EQ(table.num_chunks_of_sequence(7), 3);
  EXPECT_EQ(table.num_chunks_of_sequence(8), (int64_t{1} << 20) / 64);
  EXPECT_EQ(table.num_chunks_of_sequence(9), 0);
  EXPECT_EQ(table.num_sequences(), 10);
}

TEST(PlanChunkTable, NoSequencesAndOnlyEmptySequences) {
  const ChunkTable none = varlen_chunk_table(std::vector<int64_t>{0});
  EXPECT_EQ(none.num_sequences(), 0);
  EXPECT_EQ(none.num_chunks(), 0);
  const ChunkTable empties = varlen_chunk_table(std::vector<int64_t>{0, 0, 0, 0});
  EXPECT_EQ(empties.num_sequences(), 3);
  EXPECT_EQ(empties.num_chunks(), 0);
  EXPECT_EQ(empties.first_chunk, (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(PlanChunkTable, RandomVarlenCoverage) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int64_t> lengths(static_cast<size_t>(rng.integer(1000, 4000)));
    for (int64_t& n : lengths) {
      const double u = rng.uniform();
      n = u < 0.1 ? 0 : u < 0.3 ? rng.integer(1, 130) : rng.integer(1, 3000);
    }
    expect_varlen_table_covers(lengths);
  }
}

TEST(PlanChunkTable, BatchMode) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  std::vector<std::pair<int64_t, int64_t>> shapes{
      {0, 100}, {3, 0}, {1, 1}, {2, 64}, {5, 65}, {4, 129}, {1, int64_t{1} << 20}};
  for (int i = 0; i < 20; ++i) shapes.push_back({rng.integer(1, 64), rng.integer(1, 5000)});
  for (const auto& [batch, seqlen] : shapes) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch << " seqlen " << seqlen);
    const ChunkTable table = batch_chunk_table(batch, seqlen);
    std::vector<int64_t> batches(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) batches[b] = b;
    expect_table_covers(table, std::vector<int64_t>(static_cast<size_t>(batch), 0),
                        std::vector<int64_t>(static_cast<size_t>(batch), seqlen), batches);
  }
  EXPECT_THROW(batch_chunk_table(-1, 10), std::invalid_argument);
  EXPECT_THROW(batch_chunk_table(2, -10), std::invalid_argument);
}

// The status is an invalid-argument error whose message contains every one of `needles`.
void expect_rejected(const std::vector<int64_t>& cu, int64_t num_tokens,
                     const std::vector<std::string>& needles) {
  const Status status = validate_cu_seqlens(cu, num_tokens);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  for (const std::string& needle : needles)
    EXPECT_NE(status.message().find(needle), std::string::npos)
        << "message \"" << status.message() << "\" lacks \"" << needle << "\"";
}

TEST(PlanChunkTable, CuSeqlensErrors) {
  expect_rejected({}, 10, {"empty"});
  expect_rejected({3, 5, 10}, 10, {"cu_seqlens[0] = 3", "must be 0"});
  expect_rejected({-1, 5, 10}, 10, {"cu_seqlens[0] = -1", "must be 0"});
  expect_rejected({0, 5, -3, 10}, 10, {"cu_seqlens[2] = -3", "negative"});
  expect_rejected({0, 8, 5, 10}, 10, {"non-decreasing", "cu_seqlens[2] = 5", "cu_seqlens[1] = 8"});
  expect_rejected({0, 5, 11}, 10, {"cu_seqlens[2] = 11", "exceeds", "T = 10"});
  // The chunk-table builder rejects the same inputs.
  EXPECT_THROW(varlen_chunk_table(std::vector<int64_t>{0, 8, 5}), std::invalid_argument);
  EXPECT_THROW(varlen_chunk_table(std::vector<int64_t>{1, 8}), std::invalid_argument);
  EXPECT_THROW(varlen_chunk_table(std::vector<int64_t>{}), std::invalid_argument);
}

TEST(PlanChunkTable, ValidCuSeqlens) {
  EXPECT_TRUE(validate_cu_seqlens(std::vector<int64_t>{0}, 0).ok());
  EXPECT_TRUE(validate_cu_seqlens(std::vector<int64_t>{0, 0, 5, 5, 10}, 10).ok());
  EXPECT_TRUE(validate_cu_seqlens(std::vector<int64_t>{0, 5, 7}, 100).ok());  // padded tail
  EXPECT_EQ(sequence_lengths(std::vector<int64_t>{0, 0, 5, 5, 10}),
            (std::vector<int64_t>{0, 5, 0, 5}));
}

}  // namespace
}  // namespace flashgdn::plan
