// Internal interface of the float64 reference: one (sequence, v-head) at a time, row-major
// std::vector<double> matrices. The public entry points (include/flashgdn/reference.h) gather
// strided host tensors into these, run the math, and scatter results back.
#pragma once

#include <cstdint>
#include <vector>

#include "flashgdn/problem.h"

namespace flashgdn::reference {

inline constexpr int kChunk = 64;       // chunk length C of the chunked form
inline constexpr double kL2NormEps = 1e-6;  // x / sqrt(sum(x^2) + eps)

// One (sequence, v-head): T tokens, head dims K and V.
struct HeadInputs {
  int64_t T = 0;
  int K = 0, V = 0;
  std::vector<double> q, k;     // [T][K], already L2-normalised when the problem asks for it
  std::vector<double> v;        // [T][V]
  std::vector<double> g, beta;  // [T]
  std::vector<double> s0;       // [K][V] entering state (zeros when absent)
  double scale = 1.0;
};

struct HeadOutputs {
  std::vector<double> o;        // [T][V]
  std::vector<double> s_final;  // [K][V]
};

// Token span of one sequence inside the (batch, token) axes.
struct SequenceSpan {
  int64_t batch = 0;  // batch index (0 in varlen mode)
  int64_t bos = 0;    // first token
  int64_t eos = 0;    // one past the last token
};

// Sequences of a problem, from batch mode or the HOST cu_seqlens (cu_seqlens itself must be host
// memory for the reference).
std::vector<SequenceSpan> sequence_spans(const Inputs& in);

// Raw (not normalised) q/k rows of qk-head `qk_head`, or v/g/beta of v-head `v_head`, of one span.
std::vector<double> gather_rows(const TensorRef& t, const SequenceSpan& span, int head, int dim);
std::vector<double> gather_scalars(const TensorRef& t, const SequenceSpan& span, int head);
// State [K][V] of (sequence n, v-head h) from a states tensor in either layout.
std::vector<double> gather_state(const TensorRef& t, StateLayout layout, int64_t n, int h, int K, int V);
void scatter_rows(const TensorRef& t, const SequenceSpan& span, int head, int dim,
                  const std::vector<double>& rows);
void scatter_scalars(const TensorRef& t, const SequenceSpan& span, int head,
                     const std::vector<double>& values);
void scatter_state(const TensorRef& t, StateLayout layout, int64_t n, int h, int K, int V,
                   const std::vector<double>& state);

// In-place x / sqrt(sum(x^2) + kL2NormEps) for each row of a [rows][dim] matrix.
void l2_normalize_rows(std::vector<double>& rows, int dim);

// Everything a (sequence, v-head) needs, gathered from the problem (q/k normalised if asked).
HeadInputs gather_head(const Inputs& in, const SequenceSpan& span, int64_t sequence, int v_head);

}  // namespace flashgdn::reference
