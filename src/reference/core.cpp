// Gathering strided host tensors into per-(sequence, v-head) float64 matrices and scattering
// results back (the plumbing of the reference; no GDN math here).
//
// Element offsets, strides in elements (include/flashgdn/problem.h):
//     q, k, v, o:  b*s0 + t*s1 + head*s2 + d*s3
//     g, beta:     b*s0 + t*s1 + head*s2
//     states:      n*s0 + h*s1 + i*s2 + j*s3 with (i, j) = (k, v) for kKV and (v, k) for kVK
#include "reference/core.h"

#include <cmath>

#include "common/host_dtype.h"

namespace flashgdn::reference {
namespace {

int64_t token_offset(const TensorRef& t, const SequenceSpan& span, int64_t token, int head) {
  return span.batch * t.strides[0] + token * t.strides[1] + head * t.strides[2];
}

// Offset of state element S[i][j] (i < K, j < V) of (sequence n, v-head h).
int64_t state_offset(const TensorRef& t, StateLayout layout, int64_t n, int h, int i, int j) {
  const int64_t base = n * t.strides[0] + h * t.strides[1];
  return layout == StateLayout::kKV ? base + i * t.strides[2] + j * t.strides[3]
                                    : base + j * t.strides[2] + i * t.strides[3];
}

}  // namespace

std::vector<SequenceSpan> sequence_spans(const Inputs& in) {
  std::vector<SequenceSpan> spans;
  if (in.varlen.present()) {
    for (int64_t n = 0; n < in.varlen.num_seqs; ++n) {
      spans.push_back({0, load_index(in.varlen.cu_seqlens, in.varlen.dtype, n),
                       load_index(in.varlen.cu_seqlens, in.varlen.dtype, n + 1)});
    }
  } else {
    for (int64_t b = 0; b < in.shape.batch; ++b) spans.push_back({b, 0, in.shape.seqlen});
  }
  return spans;
}

std::vector<double> gather_rows(const TensorRef& t, const SequenceSpan& span, int head, int dim) {
  std::vector<double> rows(static_cast<size_t>((span.eos - span.bos) * dim));
  for (int64_t tok = span.bos; tok < span.eos; ++tok) {
    const int64_t base = token_offset(t, span, tok, head);
    for (int d = 0; d < dim; ++d)
      rows[(tok - span.bos) * dim + d] = load_scalar(t.data, t.dtype, base + d * t.strides[3]);
  }
  return rows;
}

std::vector<double> gather_scalars(const TensorRef& t, const SequenceSpan& span, int head) {
  std::vector<double> values(static_cast<size_t>(span.eos - span.bos));
  for (int64_t tok = span.bos; tok < span.eos; ++tok)
    values[tok - span.bos] = load_scalar(t.data, t.dtype, token_offset(t, span, tok, head));
  return values;
}

std::vector<double> gather_state(const TensorRef& t, StateLayout layout, int64_t n, int h, int K,
                                 int V) {
  std::vector<double> state(static_cast<size_t>(K) * V);
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < V; ++j)
      state[i * V + j] = load_scalar(t.data, t.dtype, state_offset(t, layout, n, h, i, j));
  return state;
}

void scatter_rows(const TensorRef& t, const SequenceSpan& span, int head, int dim,
                  const std::vector<double>& rows) {
  for (int64_t tok = span.bos; tok < span.eos; ++tok) {
    const int64_t base = token_offset(t, span, tok, head);
    for (int d = 0; d < dim; ++d)
      store_scalar(t.data, t.dtype, base + d * t.strides[3], rows[(tok - span.bos) * dim + d]);
  }
}

void scatter_scalars(const TensorRef& t, const SequenceSpan& span, int head,
                     const std::vector<double>& values) {
  for (int64_t tok = span.bos; tok < span.eos; ++tok)
    store_scalar(t.data, t.dtype, token_offset(t, span, tok, head), values[tok - span.bos]);
}

void scatter_state(const TensorRef& t, StateLayout layout, int64_t n, int h, int K, int V,
                   const std::vector<double>& state) {
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < V; ++j)
      store_scalar(t.data, t.dtype, state_offset(t, layout, n, h, i, j), state[i * V + j]);
}

void l2_normalize_rows(std::vector<double>& rows, int dim) {
  for (size_t base = 0; base < rows.size(); base += dim) {
    double sum_sq = 0.0;
    for (int d = 0; d < dim; ++d) sum_sq += rows[base + d] * rows[base + d];
    const double inv_norm = 1.0 / std::sqrt(sum_sq + kL2NormEps);
    for (int d = 0; d < dim; ++d) rows[base + d] *= inv_norm;
  }
}

HeadInputs gather_head(const Inputs& in, const SequenceSpan& span, int64_t sequence, int v_head) {
  const int K = in.shape.head_dim_k, V = in.shape.head_dim_v;
  const int qk_head = v_head / (in.shape.num_v_heads / in.shape.num_qk_heads);
  HeadInputs h;
  h.T = span.eos - span.bos;
  h.K = K;
  h.V = V;
  h.q = gather_rows(in.q, span, qk_head, K);
  h.k = gather_rows(in.k, span, qk_head, K);
  if (in.use_qk_l2norm_in_kernel) {
    l2_normalize_rows(h.q, K);
    l2_normalize_rows(h.k, K);
  }
  h.v = gather_rows(in.v, span, v_head, V);
  h.g = gather_scalars(in.g, span, v_head);
  h.beta = gather_scalars(in.beta, span, v_head);
  h.s0 = in.initial_state.present()
             ? gather_state(in.initial_state, in.state_layout, sequence, v_head, K, V)
             : std::vector<double>(static_cast<size_t>(K) * V, 0.0);
  h.scale = in.effective_scale();
  return h;
}

}  // namespace flashgdn::reference
