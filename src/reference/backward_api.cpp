// flashgdn::reference::backward — the public float64 backward on host memory.
//
// Per sequence and qk-head: for each v-head of its group (v-head h reads qk-head h / (Hv/Hqk)),
// run the token-level reverse mode (backward_tokens.cpp) on the (optionally L2-normalised) q/k,
// write dv, dg, dβ and dS_0 of that v-head, and sum dq̂/dk̂ over the group; then, with
// use_qk_l2norm_in_kernel, apply the L2-norm backward
//     dx = (dx̂ − x̂ (x̂·dx̂)) / sqrt(Σx² + 1e-6)
// to the group sums and write dq/dk. In varlen mode, tokens past cu_seqlens[N] get zero gradients.
// Shard phases: kMaps writes D (dS_0 with dht = 0) per (sequence, v-head); kFinish is the plain
// backward (the reference keeps nothing between calls).
#include <cstdint>
#include <vector>

#include "api/validate.h"
#include "common/host_dtype.h"
#include "flashgdn/reference.h"
#include "reference/backward.h"
#include "reference/core.h"

namespace flashgdn::reference {
namespace {

// Zeros rows [tok_begin, tok_end) of batch entry `batch` of a (batch, token, head, dim) tensor
// (dim == 0: a (batch, token, head) tensor of scalars).
void zero_tokens(const TensorRef& t, int64_t batch, int64_t tok_begin, int64_t tok_end, int heads,
                 int dim) {
  for (int64_t tok = tok_begin; tok < tok_end; ++tok)
    for (int hh = 0; hh < heads; ++hh) {
      const int64_t base = batch * t.strides[0] + tok * t.strides[1] + hh * t.strides[2];
      if (dim == 0) {
        store_scalar(t.data, t.dtype, base, 0.0);
      } else {
        for (int i = 0; i < dim; ++i) store_scalar(t.data, t.dtype, base + i * t.strides[3], 0.0);
      }
    }
}

}  // namespace

Status backward(const BackwardProblem& p) {
  if (Status s = detail::validate_backward(p, detail::Target::kHost); !s.ok()) return s;

  const Inputs& in = p.in;
  const Shape& sh = in.shape;
  const int K = sh.head_dim_k, V = sh.head_dim_v;
  const int Hqk = sh.num_qk_heads, Hv = sh.num_v_heads;
  const int group = Hv / Hqk;
  const bool has_h0 = in.initial_state.present();
  const bool has_dht = p.d_final_state.present();

  const std::vector<SequenceSpan> spans = sequence_spans(in);
  if (p.shard_phase == ShardPhase::kMaps) {  // D = dS_0 with dht = 0 (the dS recurrence does not read S)
    for (size_t n = 0; n < spans.size(); ++n)
      for (int hv = 0; hv < Hv; ++hv) {
        const HeadInputs head = gather_head(in, spans[n], static_cast<int64_t>(n), hv);
        const std::vector<double> d_o = gather_rows(p.d_o, spans[n], hv, V);
        scatter_state(p.shard_grad, StateLayout::kKV, static_cast<int64_t>(n), hv, K, V,
                      bwd::backward_tokens(head, d_o, {}).ds0);
      }
    return Status::ok_status();
  }
  for (size_t n = 0; n < spans.size(); ++n) {
    const SequenceSpan& span = spans[n];
    const int64_t T = span.eos - span.bos;
    for (int hq = 0; hq < Hqk; ++hq) {
      std::vector<double> dq_hat(static_cast<size_t>(T) * K, 0.0);
      std::vector<double> dk_hat(static_cast<size_t>(T) * K, 0.0);
      for (int hv = hq * group; hv < (hq + 1) * group; ++hv) {
        const HeadInputs head = gather_head(in, span, static_cast<int64_t>(n), hv);
        const std::vector<double> d_o = gather_rows(p.d_o, span, hv, V);
        const std::vector<double> d_sT =
            has_dht ? gather_state(p.d_final_state, in.state_layout, static_cast<int64_t>(n), hv, K, V)
                    : std::vector<double>();
        const bwd::HeadGrads gr = bwd::backward_tokens(head, d_o, d_sT);
        for (size_t i = 0; i < dq_hat.size(); ++i) {
          dq_hat[i] += gr.dq[i];
          dk_hat[i] += gr.dk[i];
        }
        scatter_rows(p.dv, span, hv, V, gr.dv);
        scatter_scalars(p.dg, span, hv, gr.dg);
        scatter_scalars(p.dbeta, span, hv, gr.dbeta);
        if (has_h0)
          scatter_state(p.d_initial_state, in.state_layout, static_cast<int64_t>(n), hv, K, V, gr.ds0);
      }
      if (in.use_qk_l2norm_in_kernel) {
        dq_hat = bwd::l2_normalize_rows_backward(gather_rows(in.q, span, hq, K), dq_hat, K);
        dk_hat = bwd::l2_normalize_rows_backward(gather_rows(in.k, span, hq, K), dk_hat, K);
      }
      scatter_rows(p.dq, span, hq, K, dq_hat);
      scatter_rows(p.dk, span, hq, K, dk_hat);
    }
  }

  // Padding tokens of a packed batch.
  if (in.varlen.present()) {
    const int64_t end = load_index(in.varlen.cu_seqlens, in.varlen.dtype, in.varlen.num_seqs);
    zero_tokens(p.dq, 0, end, sh.seqlen, Hqk, K);
    zero_tokens(p.dk, 0, end, sh.seqlen, Hqk, K);
    zero_tokens(p.dv, 0, end, sh.seqlen, Hv, V);
    zero_tokens(p.dg, 0, end, sh.seqlen, Hv, 0);
    zero_tokens(p.dbeta, 0, end, sh.seqlen, Hv, 0);
  }
  return Status::ok_status();
}

}  // namespace flashgdn::reference
