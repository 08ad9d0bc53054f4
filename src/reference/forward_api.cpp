// reference::forward: the public float64 forward on host memory. Validates the problem with the
// shared host-target checks (api/validate.h; every failure names the argument), then for every
// sequence and v-head gathers the inputs (q/k of qk-head h / (Hv/Hqk), L2-normalised when asked),
// runs the token recurrence (or, for tests, another form of forward_math.h), and scatters o and
// the final state. Varlen padding tokens (past cu_seqlens[N]) get o = 0. Shard phases: kMaps
// writes E (the end state from zero) and M (the end state of V = 0 from the identity, exact);
// kFinish is the plain forward (the reference keeps nothing between calls).
#include <algorithm>
#include <string>

#include "api/validate.h"
#include "flashgdn/reference.h"
#include "reference/forward_math.h"

namespace flashgdn::reference {
namespace {

Status invalid(const std::string& argument, const std::string& why) {
  return {StatusCode::kInvalidArgument, argument + ": " + why};
}

HeadOutputs run_form(const HeadInputs& head, const ForwardFormOptions& options) {
  switch (options.form) {
    case ForwardForm::kRecurrent: return recurrent_forward(head);
    case ForwardForm::kChunked: return chunked_forward(head);
    case ForwardForm::kContextParallel: {
      std::vector<int64_t> begins;
      for (int64_t b = 0; b < head.T; b += options.cp_segment_chunks * kChunk) begins.push_back(b);
      return cp_forward(head, begins, options.cp_threshold).out;
    }
  }
  return {};
}

}  // namespace

Status forward_in_form(const ForwardProblem& problem, const ForwardFormOptions& options) {
  if (Status s = detail::validate_forward(problem, detail::Target::kHost); !s.ok()) return s;
  if (options.form == ForwardForm::kContextParallel && options.cp_segment_chunks < 1)
    return invalid("cp_segment_chunks", "must be positive");
  const Inputs& in = problem.in;
  const int V = in.shape.head_dim_v;
  const std::vector<SequenceSpan> spans = sequence_spans(in);
  if (problem.shard_phase == ShardPhase::kMaps) {  // E from a zero start; M = the end state of V = 0 from I
    const int K = in.shape.head_dim_k;
    const auto N = static_cast<int64_t>(spans.size());
    for (int64_t n = 0; n < N; ++n) {
      for (int h = 0; h < in.shape.num_v_heads; ++h) {
        HeadInputs head = gather_head(in, spans[n], n, h);
        std::fill(head.s0.begin(), head.s0.end(), 0.0);
        scatter_state(problem.shard_maps, StateLayout::kKV, n, h, K, V, run_form(head, options).s_final);
        std::fill(head.v.begin(), head.v.end(), 0.0);
        for (int i = 0; i < K; ++i) head.s0[static_cast<size_t>(i) * V + i] = 1.0;
        scatter_state(problem.shard_maps, StateLayout::kKV, N + n, h, K, V, run_form(head, options).s_final);
      }
    }
    return {};
  }
  for (int64_t n = 0; n < static_cast<int64_t>(spans.size()); ++n) {
    for (int h = 0; h < in.shape.num_v_heads; ++h) {
      // The initial state of (n, h) is read before the final state of (n, h) is written, so
      // final_state may alias initial_state.
      const HeadOutputs out = run_form(gather_head(in, spans[n], n, h), options);
      scatter_rows(problem.o, spans[n], h, V, out.o);
      if (problem.final_state.present())
        scatter_state(problem.final_state, in.state_layout, n, h, in.shape.head_dim_k, V,
                      out.s_final);
    }
  }
  if (in.varlen.present()) {
    const SequenceSpan padding{0, spans.back().eos, in.shape.seqlen};
    const std::vector<double> zeros(static_cast<size_t>(padding.eos - padding.bos) * V, 0.0);
    for (int h = 0; h < in.shape.num_v_heads; ++h) scatter_rows(problem.o, padding, h, V, zeros);
  }
  return {};
}

Status forward(const ForwardProblem& problem) {
  return forward_in_form(problem, ForwardFormOptions{});
}

}  // namespace flashgdn::reference
