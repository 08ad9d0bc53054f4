// The affine chunk map and the intra-card sequence-parallel (CP) pipeline of DESIGN §1.
//
// One chunk (n rows): X = -diag(b) A_r^T K,  S' = e^gamma (I + X^T K) S - X^T diag(rho) V.
// A span of chunks composes to S_end = S* + M S_start (S* from a zero start, M the product of the
// per-chunk linear parts, later chunks on the left).
//
// CP for one (sequence, head), segments j = 0..J-1 on chunk boundaries:
//     for j < J-1: n_j = trailing_decay_window(gates of segment j, C, threshold)
//                  window:    S*_j = last n_j chunks of segment j run from zero, no M
//                  otherwise: (S*_j, M_j) over the whole segment
//     S_0 = initial state, S_{j+1} = S*_j (+ M_j S_j without a window)
//     every segment j runs the chunked form from S_j; o is their concatenation and the final
//     state the end of the last segment.
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "reference/forward_math.h"

namespace flashgdn::reference {
namespace {

// a ([rows][inner]) times b ([inner][cols]).
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int rows,
                           int inner, int cols) {
  std::vector<double> out(static_cast<size_t>(rows) * cols, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int m = 0; m < inner; ++m) {
      const double x = a[r * inner + m];
      for (int c = 0; c < cols; ++c) out[r * cols + c] += x * b[m * cols + c];
    }
  return out;
}

std::vector<double> identity(int n) {
  std::vector<double> eye(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) eye[i * n + i] = 1.0;
  return eye;
}

}  // namespace

void check_segment_begins(const HeadInputs& head, const std::vector<int64_t>& begins, const char* caller) {
  auto fail = [caller](const std::string& why) {
    throw std::invalid_argument(std::string(caller) + ": segment_begins " + why);
  };
  if (begins.empty()) {
    if (head.T != 0) fail("is empty for a non-empty sequence");
    return;
  }
  if (begins.front() != 0) fail("must start at 0");
  for (size_t j = 0; j < begins.size(); ++j) {
    if (begins[j] % kChunk != 0) fail("must be multiples of the chunk size");
    if (begins[j] >= head.T) fail("must lie inside the sequence");
    if (j > 0 && begins[j] <= begins[j - 1]) fail("must be strictly increasing");
  }
}

AffineMap chunk_affine(const HeadInputs& head, ChunkRange r) {
  const int n = r.n, K = head.K, V = head.V;
  const double* k = &head.k[r.begin * K];
  const double* v = &head.v[r.begin * V];
  const std::vector<double> x = chunk_x(head, r);
  const std::vector<double> g_cum = chunk_gate_cumsum(head, r);
  const double gamma = g_cum[n - 1];

  AffineMap map;
  // m = e^gamma (I + X^T K)
  map.m = identity(K);
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < K; ++i)
      for (int l = 0; l < K; ++l) map.m[i * K + l] += x[s * K + i] * k[s * K + l];
  const double chunk_decay = std::exp(gamma);
  for (double& e : map.m) e *= chunk_decay;
  // s_star = -X^T diag(rho) V
  map.s_star.assign(static_cast<size_t>(K) * V, 0.0);
  for (int s = 0; s < n; ++s) {
    const double rho = std::exp(gamma - g_cum[s]);
    for (int i = 0; i < K; ++i) {
      const double coef = -rho * x[s * K + i];
      for (int j = 0; j < V; ++j) map.s_star[i * V + j] += coef * v[s * V + j];
    }
  }
  return map;
}

AffineMap affine_span(const HeadInputs& head, int64_t c_begin, int64_t c_end) {
  const int K = head.K, V = head.V;
  AffineMap span{std::vector<double>(static_cast<size_t>(K) * V, 0.0), identity(K)};
  for (int64_t c = c_begin; c < c_end; ++c) {
    const AffineMap chunk = chunk_affine(head, chunk_range(head, c));
    span.s_star = matmul(chunk.m, span.s_star, K, K, V);
    for (size_t e = 0; e < span.s_star.size(); ++e) span.s_star[e] += chunk.s_star[e];
    span.m = matmul(chunk.m, span.m, K, K, K);
  }
  return span;
}

std::vector<double> zero_start_state(const HeadInputs& head, int64_t c_begin, int64_t c_end) {
  std::vector<double> s(static_cast<size_t>(head.K) * head.V, 0.0);
  for (int64_t c = c_begin; c < c_end; ++c) s = chunk_step(head, chunk_range(head, c), s).s_next;
  return s;
}

CpForwardResult cp_forward(const HeadInputs& head, const std::vector<int64_t>& segment_begins,
                           double threshold) {
  check_segment_begins(head, segment_begins, "cp_forward");
  const int K = head.K, V = head.V;
  const size_t num_segments = segment_begins.size();
  auto segment_end = [&](size_t j) {
    return j + 1 < num_segments ? segment_begins[j + 1] : head.T;
  };

  // Serial scan of the segment-entry states.
  CpForwardResult result;
  result.windowed.assign(num_segments, false);
  std::vector<std::vector<double>> entry_states{head.s0};
  for (size_t j = 0; j + 1 < num_segments; ++j) {
    const int64_t begin = segment_begins[j], end = segment_end(j);
    const int64_t c_begin = begin / kChunk, c_end = end / kChunk;
    const std::span<const double> gates(head.g.data() + begin, static_cast<size_t>(end - begin));
    const std::optional<int64_t> window = plan::trailing_decay_window(gates, kChunk, threshold);
    if (window) {
      result.windowed[j] = true;
      entry_states.push_back(zero_start_state(head, c_end - *window, c_end));
    } else {
      const AffineMap map = affine_span(head, c_begin, c_end);
      std::vector<double> next = matmul(map.m, entry_states.back(), K, K, V);
      for (size_t e = 0; e < next.size(); ++e) next[e] += map.s_star[e];
      entry_states.push_back(std::move(next));
    }
  }

  // Every segment from its fixed entering state.
  result.out.o.reserve(static_cast<size_t>(head.T) * V);
  result.out.s_final = head.s0;
  for (size_t j = 0; j < num_segments; ++j) {
    HeadOutputs part = chunked_forward(
        slice_tokens(head, segment_begins[j], segment_end(j), entry_states[j]));
    result.out.o.insert(result.out.o.end(), part.o.begin(), part.o.end());
    result.out.s_final = std::move(part.s_final);
  }
  return result;
}

}  // namespace flashgdn::reference
