// Backward entry points of a build with SM90 kernels: plan the workspace, fill the kernel
// parameters, launch on the caller's stream. No allocation, no host sync.
//
// Launch sequence (the pre-pass recomputes what the forward does not keep):
//   [l2norm_rows x2]   only with use_qk_l2norm_in_kernel: normalised q, k into the workspace
//   [chunk_offsets]    only in varlen mode (and the sequences longest first, as the forward's)
//   chunk_inverse      A_r per (chunk, v-head) (the backward differentiates through it: fp16 rows with
//                      the default fp16 merges, exact; fp32 with inverse_fp32), and for the pre-pass
//                      Ag in the input dtype and the chunks' gate records
//   fused_forward      the register-state forward (v4) on Ag, o not written (with d_final_state
//                      the state update's operand as hi + lo); S^T entering every chunk into
//                      chunk_states, in the input dtype (with CP: leading windows, then
//                      the CP forward passes; the segment table comes with chunk_offsets; with the
//                      forward's CP cache, its windows, the transitions the reverse correction
//                      needs that the cache lacks, and the pass from the given segment states)
//   [backward_ds_pass, cp_grad_correction]   with CP: dS*_j of every segment j >= 1 over its
//                      leading decay window, then dS_j = dS*_j (+ M_j^T dS_{j+1}) serially
//   backward_ds_pass   main mode, per (sequence or segment, v-head), chunks last to first: dS^T
//                      leaving every chunk into chunk_grad_states, dh0 (dgamma's <dS, S>: a
//                      sequence's last chunk's from the pre-pass, final_grad_dots; the gradient
//                      pass forms the other chunks' from its tiles)
//   backward_grads     every (chunk, v-head) at once: dv, dg, dbeta, and dq, dk: directly where
//                      Hv == Hqk, summed over each group of v-heads itself (group_sums) where a
//                      q/k head's chunks fill the SMs, else of every v-head in fp32
//   [qk_grads]         dq, dk: group sums over v-heads, L2-norm backward, cast (with the L2
//                      norm, or where the gradient pass does not sum the groups)
//   [zero_grad_padding]  only in varlen mode, unless the host copy of cu_seqlens shows no padding:
//                        dv, dg, dbeta of tokens past cu_seqlens[N] (and dq, dk where no qk_grads
//                        pass runs)
// Shard phases (ShardPhase, always with CP): kMaps = chunk_inverse, the windows, the forward state
// pass, the dS* pass (the first segment's too) and cp_grad_shard_maps (D); kFinish = the forward
// correction from initial_state, the pass writing chunk_states, cp_grad_correction from
// d_final_state and the rest, on kMaps' workspace.
//
// With the forward's inverse cache (BackwardProblem::inverse_cache) no chunk_inverse runs: A_r, Ag, the
// gate records and the window terms are read from the cache, and the workspace holds none of them
// (written by v4's chunk inverse, the bytes this backward would form; by v5, its own inverse's).
// Workspace, after the input regions: A_r [B*T, Hv, 64] (fp32 with inverse_fp32, else fp16); Ag
// [B*T, Hv, 64] and chunk_states [chunks, Hv, 128, 128] in q's dtype; the gate records fp32 [chunks,
// Hv, 128]; chunk_grad_states [chunks, Hv, 128, 128] in q's dtype and final_grad_dots fp32 [chunks,
// Hv, 8]; with group_sums the running sums fp32 [chunks, Hqk, 2, 64, 128] (dq_heads), else (unless
// Hv == Hqk without the L2 norm) dq_heads, dk_heads fp32 [B*T, Hv, 128].
#include <string>

#include "api/validate.h"
#include "flashgdn/flashgdn.h"
#include "runtime/backward.h"
#include "runtime/common.h"
#include "runtime/forward.h"

namespace flashgdn {
namespace detail {
namespace {

struct BackwardLayout {
  InputLayout inputs;
  std::size_t inverse = 0, gated_inverse = 0, chunk_gates = 0, chunk_states = 0, dq_heads = 0, dk_heads = 0;
  std::size_t chunk_grad_states = 0, final_grad_dots = 0;
  bool group_sums = false;  // the gradient pass sums each group's dq, dk itself (no qk_grads pass)
  CpDecision cp;
  CpRegions cp_regions;                  // the pre-pass's CP forward
  std::size_t grad_window_chunks = 0;    // int32 [segments, Hv]
  std::size_t chunk_window_terms = 0;    // fp32 [chunk bound, Hv]: the chunk inverse's window terms
  std::size_t segment_grad_starts = 0, segment_grad_ends = 0;  // fp32 [segments, Hv, 128, 128]
  std::size_t bytes = 0;
};

// One v-head per q/k head and no L2 norm: the fused kernel writes dq, dk itself.
bool direct_qk(const Inputs& in) {
  return in.shape.num_v_heads == in.shape.num_qk_heads && !in.use_qk_l2norm_in_kernel;
}

BackwardLayout backward_layout(const BackwardProblem& problem) {
  const Inputs& in = problem.in;
  const Shape& s = in.shape;
  const auto tokens_heads = static_cast<std::size_t>(s.batch * s.seqlen * s.num_v_heads);
  BackwardLayout layout;
  layout.inputs = input_layout(in);
  std::size_t offset = layout.inputs.end;
  const bool cached = problem.inverse_cache.present();  // the chunk inverse's outputs are in the cache
  if (!cached) {
    layout.inverse = offset;  // A_r's rows in fp32 (inverse_fp32), else in fp16 (exact: the merges' format)
    offset = align_up(offset + tokens_heads * 64 * (problem.inverse_fp32 ? sizeof(float) : 2));
    layout.gated_inverse = offset;
    offset = align_up(offset + tokens_heads * 64 * 2);
    layout.chunk_gates = offset;
    offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in)) * s.num_v_heads * 128 * sizeof(float));
  }
  layout.chunk_states = offset;
  offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in)) * s.num_v_heads * 128 * 128 * 2);
  layout.chunk_grad_states = offset;
  offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in)) * s.num_v_heads * 128 * 128 * 2);
  layout.final_grad_dots = offset;
  offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in)) * s.num_v_heads * 8 * sizeof(float));
  // The gradient pass sums each group's dq, dk itself where its units (a q/k head's chunk) fill the
  // GPU: that saves qk_grads' pass over Hv fp32 gradients (~11% of a backward at (16,32)). Its
  // running sums take 64 KiB per (chunk, q/k head) in dq_heads; otherwise dq_heads, dk_heads hold
  // every v-head's fp32 dq, dk for qk_grads.
  layout.group_sums = !direct_qk(in) && !in.use_qk_l2norm_in_kernel &&
                      chunk_bound(in) * s.num_qk_heads >= num_sms();
  if (layout.group_sums) {
    layout.dq_heads = offset;
    offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in)) * s.num_qk_heads * 2 * 64 * 128 * sizeof(float));
  } else if (!direct_qk(in)) {
    for (std::size_t* region : {&layout.dq_heads, &layout.dk_heads}) {
      *region = offset;
      offset = align_up(offset + tokens_heads * 128 * sizeof(float));
    }
  }
  // The backward plans its own cut with the backward's cost model (it need not match the forward's),
  // unless it is given the forward's CP cache: then the forward's cut.
  layout.cp = problem.cp_states.present()                ? given_cp(in, problem.cp_segment_chunks)
              : problem.shard_phase != ShardPhase::kNone ? decide_shard_cp(in, plan::CostModel::backward())
                                                         : decide_cp(in, plan::CostModel::backward());
  if (layout.cp.enabled) {
    offset = add_cp_regions(in, layout.cp, offset, layout.cp_regions);
    const auto segment_heads = static_cast<std::size_t>(layout.cp.max_segments) * s.num_v_heads;
    layout.grad_window_chunks = offset;
    offset = align_up(offset + segment_heads * sizeof(int32_t));
    if (!cached) {
      layout.chunk_window_terms = offset;
      offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in)) * s.num_v_heads * sizeof(float));
    }
    for (std::size_t* region : {&layout.segment_grad_starts, &layout.segment_grad_ends}) {
      *region = offset;
      offset = align_up(offset + segment_heads * 128 * 128 * sizeof(float));
    }
  }
  layout.bytes = offset;
  return layout;
}

}  // namespace

BackwardProblem batch_view(const BackwardProblem& problem) {
  const int64_t length = uniform_sequence_length(problem.in);
  if (length == 0) return problem;
  const int64_t n = problem.in.varlen.num_seqs;
  BackwardProblem batched = problem;
  batched.in = as_batch(problem.in, length);
  for (TensorRef* t : {&batched.d_o, &batched.dq, &batched.dk, &batched.dv, &batched.dg, &batched.dbeta})
    *t = split_token_axis(*t, n, length);
  return batched;
}

std::size_t backward_workspace_bytes(const BackwardProblem& problem) { return backward_layout(batch_view(problem)).bytes; }

}  // namespace detail

Status backward_workspace_size(const BackwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  if (auto s = detail::validate_backward(problem, detail::Target::kDevice); !s.ok()) return s;
  const BackwardProblem batched = detail::batch_view(problem);
  if (auto s = detail::check_inverse_cache_size(batched.inverse_cache, detail::inverse_cache_layout(batched.in));
      !s.ok())
    return s;
  *bytes = detail::backward_workspace_bytes(problem);
  return {};
}

Status backward(const BackwardProblem& given, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  using namespace detail;
  if (auto s = validate_backward(given, Target::kDevice); !s.ok()) return s;
  const BackwardProblem problem = batch_view(given);
  if (auto s = check_device(); !s.ok()) return s;
  const BackwardLayout layout = backward_layout(problem);
  if (problem.cp_states.present() && problem.cp_states.sizes[0] != layout.cp.max_segments)
    return {StatusCode::kInvalidArgument,
            "cp_states: " + std::to_string(problem.cp_states.sizes[0]) + " segments given, a cut of cp_segment_chunks " +
                std::to_string(problem.cp_segment_chunks) + " has " + std::to_string(layout.cp.max_segments) +
                " (pass the forward's cp_states with its forward_cp_cache_shape)"};
  if (auto s = check_inverse_cache_size(problem.inverse_cache, inverse_cache_layout(problem.in)); !s.ok()) return s;
  if (auto s = check_workspace(workspace, workspace_bytes, layout.bytes); !s.ok()) return s;
  bool longest_first = false;
  if (auto s = orders_sequences(problem.in, layout.inputs, layout.cp.enabled, longest_first); !s.ok()) return s;

  const Inputs& in = problem.in;
  auto* ws = static_cast<unsigned char*>(workspace);
  kern::BackwardParams bp;
  kern::ForwardParams& p = bp.fwd;
  if (auto s = prepare_inputs(in, layout.inputs, ws, stream, p, cp_segment_offsets(in, layout.cp, layout.cp_regions, ws),
                              layout.cp.segment_chunks, longest_first);
      !s.ok())
    return s;
  const bool cached = problem.inverse_cache.present();
  if (cached) {  // the forward's chunk inverse outputs (its window terms are read only with CP)
    bind_inverse_cache(p, problem.inverse_cache, inverse_cache_layout(in));
    if (!layout.cp.enabled) p.chunk_window_terms = nullptr;
  } else {
    p.inverse = ws + layout.inverse;
    p.gated_inverse_out = ws + layout.gated_inverse;
    // A_r's rows in fp16 where the merges are (the same values, half the gradient pass's A_r bytes)
    p.inverse_rows_fp16 = !problem.inverse_fp32;
    p.chunk_gates = reinterpret_cast<float*>(ws + layout.chunk_gates);
    // With CP the chunk inverse also sums each chunk's decay-window terms: both cp_windows (the
    // backward's leading windows, the pre-pass's trailing ones) scan those sums, not every token's K.
    if (layout.cp.enabled) p.chunk_window_terms = reinterpret_cast<float*>(ws + layout.chunk_window_terms);
  }
  void* const inverse_rows = p.inverse;  // A_r, which the gradient pass reads
  const kern::ElemKind elem = elem_kind(in);
  const bool bf16 = elem == kern::ElemKind::kBF16;
  const ShardPhase phase = problem.shard_phase;
  if (phase != ShardPhase::kFinish && !cached) {  // kFinish reuses kMaps' inverse
    const kern::InverseMerges merges = problem.inverse_fp32 ? kern::InverseMerges::kSplit : kern::InverseMerges::kHalf;
    if (auto s = launch_chunk_inverse(p, elem, kern::InverseKind::kF32, merges, stream); !s.ok()) return s;
  }
  if (layout.cp.enabled) {  // leading windows first: the pre-pass forms M_j where they are missing
    bind_cp(p, in, layout.cp, layout.cp_regions, ws);
    p.grad_window_chunks = reinterpret_cast<int32_t*>(ws + layout.grad_window_chunks);
    p.shard = phase != ShardPhase::kNone;
    p.transition_for_last = problem.d_final_state.present();
    if (problem.cp_states.present()) {  // the forward's segment states and transitions (the CP cache)
      p.segment_starts = static_cast<float*>(problem.cp_states.data);
      p.segment_transitions = static_cast<float*>(problem.cp_transitions.data);
      p.segment_starts_given = true;
    }
    if (phase != ShardPhase::kFinish) {
      if (auto s = cuda_status(bf16 ? kern::launch_cp_windows<kern::ElemKind::kBF16>(p, p.grad_window_chunks, true, stream)
                                    : kern::launch_cp_windows<kern::ElemKind::kF16>(p, p.grad_window_chunks, true, stream),
                               "cp_windows (backward)");
          !s.ok())
        return s;
    }
  }
  // kMaps: the state pass only (S*_j from zero and M_j, for kFinish's correction and the chain of
  // D); kFinish: the correction from the true entering state and the pass writing chunk_states.
  const CpStages stages = phase == ShardPhase::kMaps     ? CpStages::kStatePass
                          : phase == ShardPhase::kFinish ? CpStages::kFinish
                          : problem.cp_states.present()  ? CpStages::kGivenStarts
                                                         : CpStages::kAll;
  // The pre-pass (v4) reads Ag and the gate records; the gradient pass A_r too. With d_final_state it
  // also sums <dS_T, S> for each sequence's last chunk with S in fp32, for the gradient pass.
  p.inverse = p.gated_inverse_out;
  p.gated_inverse = true;
  if (problem.d_final_state.present()) {
    p.final_grad = static_cast<const float*>(problem.d_final_state.data);
    for (int i = 0; i < 4; ++i) p.final_grad_strides[i] = problem.d_final_state.strides[i];
    p.final_grad_dots = reinterpret_cast<float*>(ws + layout.final_grad_dots);
  }
  // The state update's operand as hi + lo where a final-state gradient is given: <dht, S> then sets
  // the last tokens' dg (bench/notes.md, session 16: the 1-row last chunk's tail); +5-13% pre-pass.
  p.exact_state_update = problem.d_final_state.present();
  // With the cache no chunk inverse runs: the pre-pass follows chunk_offsets, whose tables its early
  // start would read before that kernel has written them (fused_forward_starts_early)
  p.item_tables_pending = cached && layout.inputs.chunk_table;
  if (auto s = launch_forward_passes(p, elem, kern::InverseKind::kBF16, ws + layout.chunk_states, stream, 0,
                                     FusedKernel::kRegisterState, stages);
      !s.ok())
    return s;
  p.exact_state_update = false;
  p.item_tables_pending = false;
  p.inverse = inverse_rows;
  p.gated_inverse = false;

  bp.d_o = problem.d_o.data;
  bp.d_o_strides = row_strides(problem.d_o);
  bp.d_final_state = static_cast<const float*>(problem.d_final_state.data);
  bp.d_initial_state = static_cast<float*>(problem.d_initial_state.data);
  for (int i = 0; i < 4; ++i) {
    bp.d_final_state_strides[i] = problem.d_final_state.strides[i];
    bp.d_initial_state_strides[i] = problem.d_initial_state.strides[i];
  }
  bp.dv = problem.dv.data;
  bp.dv_strides = row_strides(problem.dv);
  bp.dg = static_cast<float*>(problem.dg.data);
  bp.dg_strides = row_strides(problem.dg);
  bp.dbeta = problem.dbeta.data;
  bp.dbeta_strides = row_strides(problem.dbeta);
  bp.direct_qk = direct_qk(in);
  bp.group_sums = layout.group_sums;
  if (!bp.direct_qk) bp.dq_heads = reinterpret_cast<float*>(ws + layout.dq_heads);
  if (!bp.direct_qk && !bp.group_sums) bp.dk_heads = reinterpret_cast<float*>(ws + layout.dk_heads);
  bp.dq = problem.dq.data;
  bp.dk = problem.dk.data;
  bp.dq_strides = row_strides(problem.dq);
  bp.dk_strides = row_strides(problem.dk);
  bp.l2norm = in.use_qk_l2norm_in_kernel;
  bp.q_raw = in.q.data;
  bp.k_raw = in.k.data;
  bp.q_raw_strides = row_strides(in.q);
  bp.k_raw_strides = row_strides(in.k);

  if (layout.cp.enabled) {  // dS* of every segment but the first (all with shards), then the reverse correction
    bp.segment_grad_starts = reinterpret_cast<float*>(ws + layout.segment_grad_starts);
    bp.segment_grad_ends = reinterpret_cast<float*>(ws + layout.segment_grad_ends);
    p.cp_pass = kern::kCpStatePass;
    if (phase != ShardPhase::kFinish) {  // kFinish reuses kMaps' dS*
      if (auto s = cuda_status(bf16 ? kern::launch_backward_ds_pass<kern::ElemKind::kBF16>(bp, stream)
                                    : kern::launch_backward_ds_pass<kern::ElemKind::kF16>(bp, stream),
                               "backward_ds_pass (dS* pass)");
          !s.ok())
        return s;
    }
    if (phase == ShardPhase::kMaps) {
      bp.shard_grad = static_cast<float*>(problem.shard_grad.data);
      return cuda_status(kern::launch_cp_grad_shard_maps(bp, stream), "cp_grad_shard_maps");
    }
    if (auto s = cuda_status(kern::launch_cp_grad_correction(bp, cp_slice_cols(p.num_seqs, p.num_v_heads), stream),
                             "cp_grad_correction");
        !s.ok())
      return s;
    p.cp_pass = kern::kCpMainPass;
  }
  // dS^T leaving every chunk (and dh0), then every chunk's gradients
  bp.chunk_grad_states = ws + layout.chunk_grad_states;
  if (auto s = cuda_status(bf16 ? kern::launch_backward_ds_pass<kern::ElemKind::kBF16>(bp, stream)
                                : kern::launch_backward_ds_pass<kern::ElemKind::kF16>(bp, stream),
                           "backward_ds_pass");
      !s.ok())
    return s;
  p.timeline = timeline_buffer();  // the gradient pass alone marks its stages (FLASHGDN_TIMELINE builds)
  if (auto s = cuda_status(bf16 ? kern::launch_backward_grads<kern::ElemKind::kBF16>(bp, num_sms(), stream)
                                : kern::launch_backward_grads<kern::ElemKind::kF16>(bp, num_sms(), stream),
                           "backward_grads");
      !s.ok())
    return s;
  p.timeline = nullptr;
  if (!bp.direct_qk && !bp.group_sums) {
    if (auto s = cuda_status(bf16 ? kern::launch_qk_grads<kern::ElemKind::kBF16>(bp, stream)
                                  : kern::launch_qk_grads<kern::ElemKind::kF16>(bp, stream),
                             "qk_grads");
        !s.ok())
      return s;
  }
  if (may_have_padding(in)) return cuda_status(kern::launch_zero_grad_padding(bp, elem, stream), "zero_grad_padding");
  return {};
}

}  // namespace flashgdn
