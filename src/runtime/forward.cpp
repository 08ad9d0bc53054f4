// Forward entry points of a build with SM90 kernels: plan the workspace, fill the kernel
// parameters from the problem, launch on the caller's stream. No allocation, no host sync.
//
// Launch sequence:
//   [l2norm_rows x2]   only with use_qk_l2norm_in_kernel: normalised q, k into the workspace
//   (short sequences, use_recurrent_decode: recurrent_decode and [zero_padding] only)
//   [chunk_offsets]    only in varlen mode: first global chunk of each sequence (with CP also the
//                      first segment of each sequence, in the same launch; without CP past one wave
//                      the sequences longest first, orders_sequences); none where the host copy
//                      of cu_seqlens shows equal lengths filling the token axis (batch_view)
//   chunk_inverse      A_r per (chunk, v-head) into the workspace (v5: chunk_gates, the gate records)
//   with intra-card CP (decide_cp; kernels and math in kernels/sm90/cp_kernels.cu):
//     cp_windows, fused_forward (state pass), cp_correction
//   fused_forward      per (sequence or segment, v-head): o and the final state
//   [zero_padding]     only in varlen mode, unless the host copy of cu_seqlens shows no padding:
//                      o of tokens past cu_seqlens[N]
// Shard phases (ShardPhase, always with CP): kMaps stops after the state pass with cp_shard_maps
// (E and M of the whole shard); kFinish starts at cp_correction, on kMaps' workspace.
#include "runtime/forward.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "api/validate.h"
#include "plan/cp_plan.h"
#include "runtime/common.h"

namespace flashgdn {
namespace detail {

namespace {

unsigned long long* g_timeline = nullptr;  // set_timeline (FLASHGDN_TIMELINE builds)

// Tokens of every sequence when the host knows them (batch mode, or a host copy of cu_seqlens).
std::optional<std::vector<int64_t>> host_lengths(const Inputs& in) {
  if (!in.varlen.present()) return std::vector<int64_t>(static_cast<std::size_t>(in.shape.batch), in.shape.seqlen);
  const int64_t* cu = in.varlen.cu_seqlens_host;
  if (cu == nullptr) return std::nullopt;
  std::vector<int64_t> lengths(static_cast<std::size_t>(in.varlen.num_seqs));
  for (int64_t i = 0; i < in.varlen.num_seqs; ++i) lengths[static_cast<std::size_t>(i)] = cu[i + 1] - cu[i];
  return lengths;
}

// Chunks of the longest sequence (of the padded length without host lengths).
int64_t longest_chunks(const Inputs& in, const std::optional<std::vector<int64_t>>& lengths) {
  if (!lengths) return plan::num_chunks_of(in.shape.seqlen);
  int64_t longest = 0;
  for (int64_t length : *lengths) longest = std::max(longest, plan::num_chunks_of(length));
  return longest;
}

// Segments of all sequences cut at `segment_chunks`: exact with host lengths, else a bound
// (sum_n ceil(C_n / L) <= (sum_n C_n) / L + N, sum_n C_n <= T / 64 + N).
int64_t segment_count(const Inputs& in, const std::optional<std::vector<int64_t>>& lengths, int64_t segment_chunks) {
  if (!lengths) return (in.shape.seqlen / 64 + in.num_sequences()) / segment_chunks + in.num_sequences() + 1;
  int64_t segments = 0;
  for (int64_t length : *lengths) segments += plan::num_segments_of(plan::num_chunks_of(length), segment_chunks);
  return segments;
}

// The problem as forward_layout and forward_with run it: equal-length packed sequences as batch mode
// (uniform_sequence_length; o split like the inputs), every other problem as given.
ForwardProblem batch_view(const ForwardProblem& problem) {
  const int64_t length = uniform_sequence_length(problem.in);
  if (length == 0) return problem;
  ForwardProblem batched = problem;
  batched.in = as_batch(problem.in, length);
  batched.o = split_token_axis(problem.o, problem.in.varlen.num_seqs, length);
  return batched;
}

}  // namespace

double resident_items(const Inputs& in) {
  const auto lengths = host_lengths(in);
  if (!lengths) return 0.0;
  int64_t total = 0;
  for (int64_t length : *lengths) total += plan::num_chunks_of(length);
  const int64_t longest = longest_chunks(in, lengths);
  return longest == 0 ? 0.0 : static_cast<double>(total) / static_cast<double>(longest) * in.shape.num_v_heads;
}

FusedKernel auto_forward_kernel(const Inputs& in, bool cp_enabled, ShardPhase phase) {
  const bool whole_sequences = !cp_enabled && phase == ShardPhase::kNone;
  return whole_sequences && 10.0 * resident_items(in) >= 4.0 * num_sms() ? FusedKernel::kInverseInside
                                                                        : FusedKernel::kRegisterState;
}

CpDecision decide_cp(const Inputs& in, const plan::CostModel& model) {
  const ContextParallelism& options = in.context_parallelism;
  if (options.mode == ContextParallel::kOff) return {};
  const auto lengths = host_lengths(in);
  int64_t segment_chunks = options.mode == ContextParallel::kOn ? options.segment_chunks : 0;
  if (segment_chunks == 0) {
    if (lengths) {
      const plan::CpPlan plan = plan::plan_cp({*lengths, in.shape.num_v_heads, num_sms()}, model);
      segment_chunks = plan.enabled ? plan.target_segment_chunks : 0;
    }
    if (segment_chunks == 0) {
      if (options.mode == ContextParallel::kAuto) return {};
      // forced on: 4 segments of the longest
      segment_chunks = std::max<int64_t>(1, (longest_chunks(in, lengths) + 3) / 4);
    }
  }
  CpDecision cp;
  cp.segment_chunks = segment_chunks;
  cp.max_segments = segment_count(in, lengths, segment_chunks);
  // without host lengths the count is a bound: CP stays on
  cp.enabled = !lengths || cp.max_segments > static_cast<int64_t>(std::count_if(
                                                  lengths->begin(), lengths->end(), [](int64_t l) { return l > 0; }));
  if (!cp.enabled) return {};
  return cp;
}

CpDecision given_cp(const Inputs& in, int64_t segment_chunks) {
  CpDecision cp;
  cp.enabled = true;
  cp.segment_chunks = segment_chunks;
  cp.max_segments = segment_count(in, host_lengths(in), segment_chunks);
  return cp;
}

CpDecision decide_shard_cp(const Inputs& in, const plan::CostModel& model) {
  Inputs planned = in;
  if (planned.context_parallelism.mode == ContextParallel::kOff) planned.context_parallelism.mode = ContextParallel::kAuto;
  CpDecision cp = decide_cp(planned, model);
  if (cp.enabled) return cp;
  const auto lengths = host_lengths(in);
  cp.enabled = true;
  cp.segment_chunks = std::max<int64_t>(1, longest_chunks(in, lengths));
  cp.max_segments = segment_count(in, lengths, cp.segment_chunks);
  return cp;
}

std::size_t add_cp_regions(const Inputs& in, const CpDecision& cp, std::size_t offset, CpRegions& regions) {
  const auto segment_heads = static_cast<std::size_t>(cp.max_segments) * in.shape.num_v_heads;
  if (in.varlen.present()) {
    regions.segment_offsets = offset;
    offset = align_up(offset + static_cast<std::size_t>(in.varlen.num_seqs + 1) * sizeof(int32_t));
  }
  regions.window_chunks = offset;
  offset = align_up(offset + segment_heads * sizeof(int32_t));
  for (std::size_t* region : {&regions.segment_ends, &regions.segment_transitions, &regions.segment_starts}) {
    *region = offset;
    offset = align_up(offset + segment_heads * 128 * 128 * sizeof(float));
  }
  return offset;
}

int32_t* cp_segment_offsets(const Inputs& in, const CpDecision& cp, const CpRegions& regions, unsigned char* ws) {
  return cp.enabled && in.varlen.present() ? reinterpret_cast<int32_t*>(ws + regions.segment_offsets) : nullptr;
}

void bind_cp(kern::ForwardParams& p, const Inputs& in, const CpDecision& cp, const CpRegions& regions,
             unsigned char* ws) {
  p.segment_chunks = cp.segment_chunks;
  p.max_segments = cp.max_segments;
  p.decay_threshold = in.context_parallelism.decay_threshold;
  p.window_chunks = reinterpret_cast<int32_t*>(ws + regions.window_chunks);
  p.segment_ends = reinterpret_cast<float*>(ws + regions.segment_ends);
  p.segment_transitions = reinterpret_cast<float*>(ws + regions.segment_transitions);
  p.segment_starts = reinterpret_cast<float*>(ws + regions.segment_starts);
  p.cp_pass = kern::kCpMainPass;
  p.segment_offsets = cp_segment_offsets(in, cp, regions, ws);
}

Status launch_forward_passes(kern::ForwardParams& p, kern::ElemKind elem, kern::InverseKind inverse,
                             void* chunk_states, cudaStream_t stream, int32_t forced_v_split, FusedKernel kernel,
                             CpStages stages) {
  if (chunk_states != nullptr && (kernel != FusedKernel::kRegisterState || p.o != nullptr))
    return {StatusCode::kNotSupported, "chunk_states: written by the register-state forward (kernel 4) without o only"};
  const bool specialized = kernel == FusedKernel::kWarpSpecialized || kernel == FusedKernel::kRegisterState ||
                           kernel == FusedKernel::kInverseInside;
  p.warp_specialized = kernel == FusedKernel::kWarpSpecialized;
  p.register_state = kernel == FusedKernel::kRegisterState;
  p.inverse_inside = kernel == FusedKernel::kInverseInside;
  p.wgmma = kernel == FusedKernel::kWgmma || (kernel == FusedKernel::kAuto && forced_v_split == 0);
  auto split = [&](int64_t items) {
    return p.wgmma || specialized ? 1 : forced_v_split != 0 ? forced_v_split : choose_v_split(items, p.num_v_heads);
  };
  if (p.cp_pass != kern::kNoCp) {
    // the windows, then the state pass: S*_j from zero and M_j where a head has no window (gridDim.z =
    // 2); with the forward's CP cache (kGivenStarts) the windows say which M_j the cache holds, and the
    // pass's z = 1 CTAs form the others the reverse correction needs (work_item: no S*_j). kFinish
    // reuses kMaps' state pass.
    if (stages != CpStages::kFinish) {
      const bool bf16 = elem == kern::ElemKind::kBF16;
      if (auto s = cuda_status(bf16 ? kern::launch_cp_windows<kern::ElemKind::kBF16>(p, p.window_chunks, false, stream)
                                    : kern::launch_cp_windows<kern::ElemKind::kF16>(p, p.window_chunks, false, stream),
                               "cp_windows");
          !s.ok())
        return s;
      p.cp_pass = kern::kCpStatePass;
      p.chunk_states = nullptr;
      p.v_split = split(2 * p.max_segments);
      if (auto s = launch_fused_forward(p, elem, inverse, stream); !s.ok()) return s;
      if (stages == CpStages::kMaps) return cuda_status(kern::launch_cp_shard_maps(p, stream), "cp_shard_maps");
      if (stages == CpStages::kStatePass) return {};
    }
    if (stages != CpStages::kGivenStarts) {  // given starts: the cache holds the corrected states
      if (auto s = cuda_status(kern::launch_cp_correction(p, cp_slice_cols(p.num_seqs, p.num_v_heads), stream),
                               "cp_correction");
          !s.ok())
        return s;
    }
    p.cp_pass = kern::kCpMainPass;
  }
  p.chunk_states = chunk_states;
  p.v_split = split(p.cp_pass == kern::kNoCp ? p.num_seqs : p.max_segments);
  return launch_fused_forward(p, elem, inverse, stream);
}

int32_t choose_v_split(int64_t items, int32_t num_v_heads) {
  return items * num_v_heads * 2 <= num_sms() ? 2 : 1;
}

bool use_recurrent_decode(const ForwardProblem& problem) {
  const Inputs& in = problem.in;
  const int64_t sequences = in.num_sequences();
  if (problem.checkpoints.present() || sequences == 0) return false;
  if (!in.varlen.present()) return in.shape.seqlen <= kDecodeTokensPerSequence;
  if (in.shape.seqlen > kDecodeTokensPerSequence * sequences) return false;
  if (const int64_t* cu = in.varlen.cu_seqlens_host) {
    for (int64_t i = 0; i < sequences; ++i)
      if (cu[i + 1] - cu[i] > kDecodeMaxTokens) return false;
  }
  return true;
}

bool forms_reusable_inverse(const ForwardLayout& layout, FusedKernel kernel, kern::InverseKind inverse) {
  if (layout.decode || inverse != kern::InverseKind::kBF16) return false;
  return kernel == FusedKernel::kRegisterState || (kernel == FusedKernel::kInverseInside && !layout.cp.enabled);
}

ForwardLayout forward_layout(const ForwardProblem& given, kern::InverseKind inverse) {
  const ForwardProblem problem = batch_view(given);
  const Inputs& in = problem.in;
  const Shape& s = in.shape;
  ForwardLayout layout;
  const bool shard = problem.shard_phase != ShardPhase::kNone;
  layout.decode = !shard && use_recurrent_decode(problem);
  layout.inputs = input_layout(in, !layout.decode);  // the recurrent decode needs no chunk table
  std::size_t offset = layout.inputs.end;
  if (layout.decode) {
    layout.bytes = offset;
    return layout;
  }
  // with the inverse cache, the chunk inverse writes A_r, Ag, the gate records and the window terms there
  const bool cached = problem.inverse_cache.present();
  if (!cached) {
    layout.inverse = offset;
    const std::size_t inverse_elem = inverse == kern::InverseKind::kF32 ? 4 : 2;
    offset = align_up(offset + static_cast<std::size_t>(s.batch * s.seqlen * s.num_v_heads) * 64 * inverse_elem);
    layout.chunk_gates = offset;
    offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in) * s.num_v_heads) * 128 * sizeof(float));
  }
  layout.cp = shard ? decide_shard_cp(in) : decide_cp(in);
  if (layout.cp.enabled) {
    offset = add_cp_regions(in, layout.cp, offset, layout.cp_regions);
    if (!cached) {
      layout.chunk_window_terms = offset;
      offset = align_up(offset + static_cast<std::size_t>(chunk_bound(in) * s.num_v_heads) * sizeof(float));
    }
  }
  if (problem.checkpoints.present() && in.varlen.present()) {
    layout.checkpoint_offsets = offset;
    offset = align_up(offset + static_cast<std::size_t>(in.varlen.num_seqs + 1) * sizeof(int32_t));
  }
  layout.bytes = offset;
  return layout;
}

Status forward_with(const ForwardProblem& given, const ForwardVariant& variant, void* workspace,
                    std::size_t workspace_bytes, cudaStream_t stream) {
  if (auto s = validate_forward(given, Target::kDevice); !s.ok()) return s;
  const ForwardProblem problem = batch_view(given);
  if (variant.v_split < 0 || variant.v_split > 2)
    return {StatusCode::kInvalidArgument, "v_split: must be 0 (automatic), 1 or 2"};
  if (variant.kernel < FusedKernel::kAuto || variant.kernel > FusedKernel::kInverseInside)
    return {StatusCode::kInvalidArgument,
            "kernel: must be 0 (automatic), 1 (mma.sync), 2 (wgmma), 3 (warp-specialized), 4 (register state) or "
            "5 (inverse inside)"};
  if (variant.kernel >= FusedKernel::kWgmma && variant.v_split == 2)
    return {StatusCode::kInvalidArgument, "v_split: the wgmma kernels have no V split (v_split 0 or 1)"};
  if (variant.kernel >= FusedKernel::kRegisterState && variant.inverse == kern::InverseKind::kF32)
    return {StatusCode::kInvalidArgument,
            "kernel: 4 (register state) and 5 (inverse inside) take the bf16 inverse only (inverse_fp32 off)"};
  const kern::InverseKind inverse = variant.inverse;
  if (auto s = check_device(); !s.ok()) return s;
  const ForwardLayout layout = forward_layout(problem, inverse);
  // kAuto: auto_forward_kernel with the bf16 inverse; the wgmma kernel with the fp32 one, the
  // mma.sync kernel when a V split is forced (launch_forward_passes).
  const bool auto_bf16 = variant.kernel == FusedKernel::kAuto && variant.v_split == 0 &&
                         inverse == kern::InverseKind::kBF16;
  const FusedKernel kernel =
      auto_bf16 ? auto_forward_kernel(problem.in, layout.cp.enabled, problem.shard_phase) : variant.kernel;
  if (problem.cp_states.present()) {
    if (!layout.cp.enabled)
      return {StatusCode::kInvalidArgument,
              "cp_states: this call runs no intra-card CP (forward_cp_cache_shape gives segment_chunks 0); leave it "
              "absent"};
    if (problem.cp_states.sizes[0] != layout.cp.max_segments)  // cp_transitions' rows equal (validated)
      return {StatusCode::kInvalidArgument, "cp_states: " + std::to_string(problem.cp_states.sizes[0]) +
                                                " segments given, the cut has " +
                                                std::to_string(layout.cp.max_segments) + " (forward_cp_cache_shape)"};
  }
  const bool caches_inverse = problem.inverse_cache.present();
  if (caches_inverse) {
    if (!forms_reusable_inverse(layout, kernel, inverse))
      return {StatusCode::kInvalidArgument,
              "inverse_cache: this call runs no chunk inverse the backward can take (the default inverse does in the "
              "register-state kernel, and in the inverse-inside kernel without CP; forward_inverse_cache_bytes gives 0 "
              "where the default kernel forms none): leave it absent"};
    if (auto s = check_inverse_cache_size(problem.inverse_cache, inverse_cache_layout(problem.in)); !s.ok()) return s;
  }
  if (auto s = check_workspace(workspace, workspace_bytes, layout.bytes); !s.ok()) return s;

  bool longest_first = false;
  if (auto s = orders_sequences(problem.in, layout.inputs, layout.cp.enabled, longest_first); !s.ok()) return s;

  auto* ws = static_cast<unsigned char*>(workspace);
  kern::ForwardParams p;
  if (auto s = prepare_inputs(problem.in, layout.inputs, ws, stream, p,
                              cp_segment_offsets(problem.in, layout.cp, layout.cp_regions, ws),
                              layout.cp.segment_chunks, longest_first);
      !s.ok())
    return s;
  p.timeline = g_timeline;
  p.o = problem.o.data;
  p.o_strides = row_strides(problem.o);
  p.final_state = problem.final_state.data;
  p.final_state_bf16 = problem.final_state.dtype == DType::kBF16;
  p.final_state_slots = static_cast<const int32_t*>(problem.final_state_indices.data);
  p.token_states = static_cast<float*>(problem.token_states.data);
  for (int i = 0; i < 4; ++i) p.token_state_strides[i] = problem.token_states.strides[i];
  if (problem.checkpoints.present()) {
    p.checkpoints = static_cast<float*>(problem.checkpoints.data);
    for (int i = 0; i < 4; ++i) p.checkpoint_strides[i] = problem.checkpoints.strides[i];
    p.checkpoint_chunks = problem.checkpoint_chunks;
    if (problem.in.varlen.present()) {
      p.checkpoint_offsets = reinterpret_cast<int32_t*>(ws + layout.checkpoint_offsets);
      if (auto s = cuda_status(kern::launch_checkpoint_offsets(p, stream), "checkpoint_offsets"); !s.ok()) return s;
    }
  }
  for (int i = 0; i < 4; ++i) p.final_state_strides[i] = problem.final_state.strides[i];
  p.inverse = ws + layout.inverse;
  // v4 takes Ag in place of A_r and reads the gate records; v5 forms A_r itself and reads the gate
  // records of launch_chunk_gates; the other kernels need neither, so the inverse writes none for
  // them (kShardFinish reuses kShardMaps' inverse or gate records: both with one kernel).
  p.gated_inverse = kernel == FusedKernel::kRegisterState;
  const bool inverse_inside = kernel == FusedKernel::kInverseInside;
  p.chunk_gates = p.gated_inverse || inverse_inside ? reinterpret_cast<float*>(ws + layout.chunk_gates) : nullptr;
  // With CP, v4's chunk inverse (which has K K^T and the gates) sums the decay-window terms per chunk
  // for cp_windows; elsewhere cp_windows reads every token's K row.
  if (layout.cp.enabled && p.gated_inverse)
    p.chunk_window_terms = reinterpret_cast<float*>(ws + layout.chunk_window_terms);
  // The inverse cache: the chunk inverse in the backward's format (A_r's fp16 rows beside Ag, the
  // window terms with or without CP), so that the backward runs none; v4 then reads Ag from the cache,
  // v5 writes all of it itself (its kKeepsInverse kernel) beside the gate records of chunk_gates.
  if (caches_inverse) bind_inverse_cache(p, problem.inverse_cache, inverse_cache_layout(problem.in));

  const kern::ElemKind elem = elem_kind(problem.in);
  if (layout.decode) {
    const auto launch_decode = elem == kern::ElemKind::kBF16 ? kern::launch_recurrent_decode<kern::ElemKind::kBF16>
                                                             : kern::launch_recurrent_decode<kern::ElemKind::kF16>;
    if (auto s = cuda_status(launch_decode(p, stream), "recurrent_decode"); !s.ok()) return s;
    return may_have_padding(problem.in) ? cuda_status(kern::launch_zero_padding(p, elem, stream), "zero_padding")
                                        : Status{};
  }
  const ShardPhase phase = problem.shard_phase;
  if (caches_inverse && !inverse_inside) {
    // the backward's chunk-inverse outputs (A_r's fp16 rows beside Ag) by the 16-bit inverse: the fp32
    // one's bytes at 5 or 6 CTAs a SM where that has 4 (chunk_inverse_ctas_per_sm); then v4 on Ag
    if (auto s = launch_chunk_inverse(p, elem, kern::InverseKind::kBF16, kern::InverseMerges::kHalf, stream); !s.ok())
      return s;
    p.inverse = p.gated_inverse_out;
  } else if (phase != ShardPhase::kFinish) {  // kFinish reuses kMaps' inverse (or gate records); v5 keeping
                                               // the inverse cache: its gate records go there
    if (auto s = inverse_inside ? cuda_status(kern::launch_chunk_gates(p, stream), "chunk_gates")
                                : launch_chunk_inverse(p, elem, inverse,
                                                       inverse == kern::InverseKind::kF32 ? kern::InverseMerges::kSplit
                                                                                          : kern::InverseMerges::kHalf,
                                                       stream);
        !s.ok())
      return s;
  }
  if (layout.cp.enabled) {
    bind_cp(p, problem.in, layout.cp, layout.cp_regions, ws);
    // the CP cache: the state pass writes the transitions there (the last segments' too), the
    // correction the segment states, which the main pass reads
    if (problem.cp_states.present()) {
      p.segment_starts = static_cast<float*>(problem.cp_states.data);
      p.segment_transitions = static_cast<float*>(problem.cp_transitions.data);
      p.cache_transitions = true;
    }
  }
  p.shard = phase != ShardPhase::kNone;
  p.shard_maps = static_cast<float*>(problem.shard_maps.data);
  const CpStages stages = phase == ShardPhase::kMaps     ? CpStages::kMaps
                          : phase == ShardPhase::kFinish ? CpStages::kFinish
                                                         : CpStages::kAll;
  if (auto s = launch_forward_passes(p, elem, inverse, nullptr, stream, variant.v_split, kernel, stages);
      !s.ok())
    return s;
  if (phase == ShardPhase::kMaps) return {};
  if (may_have_padding(problem.in)) return cuda_status(kern::launch_zero_padding(p, elem, stream), "zero_padding");
  return {};
}

unsigned long long* timeline_buffer() { return g_timeline; }

Status set_timeline(void* device_buffer) {
#ifdef FLASHGDN_TIMELINE
  g_timeline = static_cast<unsigned long long*>(device_buffer);
  return {};
#else
  (void)device_buffer;
  return {StatusCode::kNotSupported, "timeline: this build has no timeline (configure with -DFLASHGDN_TIMELINE=ON)"};
#endif
}

}  // namespace detail

Status forward_workspace_size(const ForwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  if (auto s = detail::validate_forward(problem, detail::Target::kDevice); !s.ok()) return s;
  *bytes = detail::forward_layout(problem, detail::kDefaultInverse).bytes;
  return {};
}

Status forward_cp_cache_shape(const ForwardProblem& problem, CpCacheShape* shape) {
  if (shape == nullptr) return {StatusCode::kInvalidArgument, "shape: null pointer"};
  *shape = {};
  if (auto s = detail::validate_inputs(problem.in, detail::Target::kDevice); !s.ok()) return s;
  if (problem.shard_phase != ShardPhase::kNone) return {};
  const detail::ForwardLayout layout = detail::forward_layout(problem, detail::kDefaultInverse);
  if (!layout.cp.enabled) return {};
  shape->segment_chunks = layout.cp.segment_chunks;
  shape->segments = layout.cp.max_segments;
  return {};
}

Status forward_inverse_cache_bytes(const ForwardProblem& given, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  if (auto s = detail::validate_inputs(given.in, detail::Target::kDevice); !s.ok()) return s;
  const ForwardProblem problem = detail::batch_view(given);
  const detail::ForwardLayout layout = detail::forward_layout(problem, detail::kDefaultInverse);
  const detail::FusedKernel kernel = detail::auto_forward_kernel(problem.in, layout.cp.enabled, problem.shard_phase);
  if (problem.shard_phase == ShardPhase::kNone && detail::forms_reusable_inverse(layout, kernel, detail::kDefaultInverse))
    *bytes = detail::inverse_cache_layout(problem.in).bytes;
  return {};
}

Status forward(const ForwardProblem& problem, void* workspace, std::size_t workspace_bytes,
               cudaStream_t stream) {
  return detail::forward_with(problem, {}, workspace, workspace_bytes, stream);
}

}  // namespace flashgdn
