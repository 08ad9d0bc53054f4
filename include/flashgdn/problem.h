// flashgdn public C++ API: descriptions of a forward and a backward GDN problem.
//
// The operation, per sequence and value head h, tokens t (DESIGN §1):
//     S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,     o_t = scale * S_t^T q_t
// with S in R^{K x V}, g_t <= 0 a log-space forget gate, beta_t in (0,1). v-head h reads q/k head
// h / (Hv / Hqk). With use_qk_l2norm_in_kernel, q and k are first L2-normalised:
//     x / sqrt(sum(x^2) + 1e-6).
//
// Tensor dimensions (strides in elements, TensorRef::strides in this order):
//     q, k            (batch, token, qk_head, K)
//     v, o, d_o, dv   (batch, token, v_head, V)
//     g, beta, dg, dbeta  (batch, token, v_head)
//     states          (sequence, v_head, K, V) for StateLayout::kKV, (sequence, v_head, V, K) for kVK
//     dq, dk          (batch, token, qk_head, K)   (summed over each group of Hv/Hqk v-heads)
// Batch mode: `batch` sequences of `seqlen` tokens each. Varlen mode: batch == 1, the sequences
// are packed along the token axis and described by cu_seqlens (num_seqs + 1 offsets,
// non-decreasing, cu_seqlens[0] == 0, cu_seqlens[num_seqs] <= seqlen). Tokens past
// cu_seqlens[num_seqs] are padding: their o (and gradients) are written as zeros.
#pragma once

#include <optional>

#include "flashgdn/types.h"

namespace flashgdn {

struct Shape {
  int64_t batch = 1;         // B: equal-length sequences, or 1 in varlen mode
  int64_t seqlen = 0;        // T: tokens per batch entry (all packed tokens in varlen mode)
  int32_t num_qk_heads = 0;  // Hqk
  int32_t num_v_heads = 0;   // Hv, a multiple of Hqk
  int32_t head_dim_k = 128;  // K
  int32_t head_dim_v = 128;  // V
};

// Packed variable-length sequences. Absent (cu_seqlens == nullptr) means batch mode.
struct Varlen {
  const void* cu_seqlens = nullptr;          // num_seqs + 1 offsets, on the device (host for the reference)
  DType dtype = DType::kI32;                 // kI32 or kI64
  int64_t num_seqs = 0;                      // N
  const int64_t* cu_seqlens_host = nullptr;  // optional host copy: lets the host plan without a device sync
                                             // (and run N sequences of one length filling the token
                                             // axis as batch mode: same results, one kernel fewer)

  bool present() const { return cu_seqlens != nullptr; }
};

// Intra-card context parallelism: long sequences cut into segments of
// segment_chunks * 64 tokens, run in parallel and stitched by a short serial correction (exact for
// heads whose gates do not decay a segment below e^{decay_threshold}, within e^{decay_threshold}
// of the state's norm for the others). kAuto lets the planner decide from the sequence lengths,
// which it knows in batch mode or from Varlen::cu_seqlens_host (without it, kAuto means off). The
// backward follows the same options and plans its own cut with its own fitted cost model.
enum class ContextParallel { kAuto, kOff, kOn };
struct ContextParallelism {
  ContextParallel mode = ContextParallel::kAuto;
  int64_t segment_chunks = 0;    // kOn: segment length in chunks (0: the planner's choice)
  float decay_threshold = -10.f; // natural log, < 0
};

// Everything the forward reads; the backward reads the same.
struct Inputs {
  Shape shape;
  Varlen varlen;
  TensorRef q, k, v;       // bf16 or fp16 (the reference also takes fp32/fp64); q, k, v share a dtype
  TensorRef g;             // fp32 log-space gate, <= 0 (the reference also takes fp64)
  TensorRef beta;          // fp32 or bf16
  TensorRef initial_state; // optional, fp32 or bf16 storage (forward; the backward takes fp32), states
                           // layout: [N, ...], or a pool [P, ...] read through
                           // initial_state_indices
  // Optional, int32 [N] on the device (forward only): the pool slot of each sequence's initial
  // state in initial_state; -1 = a zero start.
  TensorRef initial_state_indices;
  StateLayout state_layout = StateLayout::kKV;
  std::optional<float> scale;  // default K^-1/2
  bool use_qk_l2norm_in_kernel = false;
  ContextParallelism context_parallelism;

  int64_t num_sequences() const { return varlen.present() ? varlen.num_seqs : shape.batch; }
  float effective_scale() const;
};

// Inter-GPU context parallelism (a sequence sharded over devices, flashgdn.distributed): a shard
// runs in two phases on one workspace. Over a shard, S_end = M S_start + E (M [K, K] the product of
// the tokens' maps, E the end state from a zero start).
//   kMaps:   E and M of every (sequence, v-head) into shard_maps; o, final_state, checkpoints,
//            token_states and the pool indices absent; initial_state ignored. M is exact, or zero
//            where the shard forgets its entering state (a segment decays below
//            e^{decay_threshold}, as in intra-card CP). The chunk inverse and the segment states
//            stay in the workspace.
//   kFinish: o (and the final state) from initial_state = the true entering state, reusing what
//            kMaps left in the workspace: no chunk inverse and no state pass again. Call it with
//            the same inputs (initial_state aside), options and workspace as kMaps, on the same
//            stream, the workspace untouched in between (not checked: it lives on the device).
// Both phases always cut the shard into segments (the planner's, else one per sequence).
enum class ShardPhase : int32_t { kNone = 0, kMaps = 1, kFinish = 2 };

struct ForwardProblem {
  Inputs in;
  TensorRef o;            // output, dtype of v
  TensorRef final_state;  // optional output, fp32 or bf16 storage, states layout: [N, ...], or a pool [P, ...] written
                          // through final_state_indices; may alias in.initial_state exactly
  // Optional, int32 [N] on the device: the pool slot each sequence's final state is written to;
  // -1 = not written. Slots must lie in [-1, P); a slot written must be neither read by another
  // sequence nor written by two (not checked: the indices live on the device).
  TensorRef final_state_indices;
  // Optional state checkpoints for prefix caching: with checkpoint_chunks = n >= 1, the state after
  // every n * 64 tokens of each sequence (t = j n 64 <= length, j >= 1) goes to checkpoints
  // [C, Hv, ...] (fp32, states layout) at row first(i) + j - 1, where first(i) is the sum over the
  // earlier sequences of floor(length / (n 64)); C = batch * floor(seqlen / (n 64)) in batch mode,
  // floor(seqlen / (n 64)) in varlen mode (a bound: rows past the total are not written).
  TensorRef checkpoints;
  int64_t checkpoint_chunks = 0;
  // Optional, decode-sized calls only (at most 8 tokens per sequence on average): the state after
  // every token, fp32 [B * T, Hv, ...] (row b * T + t; the packed token t with cu_seqlens), for
  // rolling back rejected speculative tokens.
  TensorRef token_states;
  // kMaps output, fp32 contiguous [2 N, Hv, K, K] with K == V: rows 0..N-1 hold E, rows N..2N-1 M
  // (row-major [K][V] blocks whatever in.state_layout).
  ShardPhase shard_phase = ShardPhase::kNone;
  TensorRef shard_maps;
  // Optional outputs, both or neither, for the backward (the CP cache): the state entering every
  // segment of the intra-card CP cut this call runs (cp_states, fp32 contiguous [segments, Hv, K, V])
  // and the segments' transitions M_j where a head has no decay window (cp_transitions, fp32
  // contiguous [segments, Hv, K, K], K == V), in the library's own layout (pass them to the
  // backward unchanged), with `segments` and the cut from forward_cp_cache_shape. Only for a call
  // that runs CP (forward_cp_cache_shape's segment_chunks > 0), without shard phases. The states and
  // the transitions are what the forward forms anyway (they go there instead of the workspace), but
  // for the last segments' transitions, formed for the backward's final-state gradient in the same
  // pass as the others.
  TensorRef cp_states;
  TensorRef cp_transitions;
  // Optional output for the backward (the inverse cache): uint8, contiguous [bytes] with bytes =
  // forward_inverse_cache_bytes, in the library's own layout (pass it to the backward unchanged): what
  // this call's chunk inverse forms and the backward would form again from the inputs (A_r, which the
  // gradients differentiate through, as the fp16 merges' exact fp16 rows; Ag; the chunks' gate records
  // and decay-window terms). Only for a call that forms the chunk inverse in the backward's format
  // (forward_inverse_cache_bytes > 0: the default fp16-merged inverse, in the register-state kernel or,
  // without CP, the inverse-inside kernel; no shard phases). On the register-state kernel it costs the
  // forward the A_r rows' store (128 B a token and v-head) and the backward's gradients with it equal
  // those without, bit for bit; the inverse-inside kernel stores its own A_r and Ag (256 B a token and
  // v-head), whose fp16 rounding differs from the backward's chunk inverse, so the gradients differ
  // from those without by about that rounding (within the same tolerances of the exact ones).
  TensorRef inverse_cache;
};

struct BackwardProblem {
  Inputs in;
  TensorRef d_o;              // gradient of o, dtype of v
  TensorRef d_final_state;    // optional, fp32, states layout
  TensorRef dq, dk, dv;       // outputs, dtype of q/k/v
  TensorRef dg;               // output, fp32: gradient w.r.t. the raw per-token gate g
  TensorRef dbeta;            // output, dtype of beta
  TensorRef d_initial_state;  // output, fp32; required exactly when in.initial_state is present
  // Inter-GPU CP (ShardPhase), in reverse: kMaps writes only shard_grad, fp32 contiguous
  // [N, Hv, K, V] (row-major [K][V] blocks whatever in.state_layout): D, the gradient that d_o
  // alone sends into each sequence's entering state
  // (d_final_state, the gradients and initial_state absent); kFinish is the backward from
  // initial_state (the true entering state) and d_final_state (the true gradient leaving the shard),
  // reusing kMaps' workspace (its chunk inverse, segment states, transitions and dS* pass): same
  // inputs and options (inverse_fp32 too: kFinish reads kMaps' chunk inverse in the format kMaps
  // wrote it), same workspace, untouched in between, same stream.
  ShardPhase shard_phase = ShardPhase::kNone;
  TensorRef shard_grad;
  // The chunk inverse (A_r, which the gradients differentiate through, kept in fp32) merged in split bf16
  // (bf16x3), for keys past beta |k|^2 <= 2, as the forward's fp32 inverse; false (the default):
  // merged in fp16 (K K^T held in fp16 too), as the forward's default inverse, which needs
  // beta |k|^2 <= 2 (normalised keys, beta in (0, 2]); keys far past it overflow fp16 and give
  // non-finite gradients, never finite wrong ones.
  bool inverse_fp32 = false;
  // Optional, the forward's CP cache (ForwardProblem::cp_states and cp_transitions of a forward with
  // the same inputs and options, and cp_segment_chunks = forward_cp_cache_shape's segment_chunks of
  // it): the backward then runs that cut (its own planner is not asked) and skips what rebuilds the
  // segment states (the state pass's segment end states and the correction) and the transitions the
  // forward formed; it forms the few others its reverse correction needs (heads whose backward
  // window is missing where the forward's was not: expansive keys) into cp_transitions. Not with
  // shard phases.
  TensorRef cp_states;
  TensorRef cp_transitions;
  int64_t cp_segment_chunks = 0;
  // Optional, the forward's inverse cache (ForwardProblem::inverse_cache written by a forward with the
  // same inputs and options): the backward then runs no chunk inverse. Read only; not with inverse_fp32
  // or shard phases.
  TensorRef inverse_cache;
};

}  // namespace flashgdn
