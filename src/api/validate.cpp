// Validation of forward and backward problems. Every failure names the argument (with the
// Python API's name for it) and says what is wrong. Reads no device memory; cu_seqlens offsets are
// checked through the optional host copy (or directly, for the host reference).
#include "api/validate.h"

#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "flashgdn/flashgdn.h"

namespace flashgdn::detail {
namespace {

Status invalid(const std::string& message) { return {StatusCode::kInvalidArgument, message}; }
Status unsupported(const std::string& message) { return {StatusCode::kNotSupported, message}; }

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64;
}

// A tensor argument: its name, view, and the extents of its dimensions.
struct Arg {
  const char* name;
  const TensorRef* ref;
  int rank;
  std::array<int64_t, 4> extents;

  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= extents[i];
    return n;
  }
  // Byte range [lo, hi) the view can touch; empty when any extent is 0.
  std::pair<uintptr_t, uintptr_t> byte_range() const {
    if (elements() == 0) return {0, 0};
    int64_t last = 0;
    for (int i = 0; i < rank; ++i) last += (extents[i] - 1) * ref->strides[i];
    const auto base = reinterpret_cast<uintptr_t>(ref->data);
    return {base, base + static_cast<uintptr_t>((last + 1) * dtype_size(ref->dtype))};
  }
};

std::string dims_text(const Arg& a) {
  std::ostringstream out;
  out << "[";
  for (int i = 0; i < a.rank; ++i) out << (i ? ", " : "") << a.extents[i];
  out << "]";
  return out.str();
}

// Strides: non-negative; an output must not map two indices to one element.
Status check_strides(const Arg& a, bool is_output) {
  for (int i = 0; i < a.rank; ++i) {
    if (a.ref->strides[i] < 0)
      return invalid(cat(a.name, ": negative stride ", a.ref->strides[i], " in dimension ", i));
  }
  if (!is_output || a.elements() == 0) return {};
  int order[4] = {0, 1, 2, 3};  // dimensions by increasing stride (insertion sort of <= 4)
  for (int i = 1; i < a.rank; ++i)
    for (int j = i; j > 0 && a.ref->strides[order[j]] < a.ref->strides[order[j - 1]]; --j)
      std::swap(order[j], order[j - 1]);
  int64_t span = 1;  // elements covered by the dimensions sorted so far
  for (int j = 0; j < a.rank; ++j) {
    const int d = order[j];
    if (a.extents[d] == 1) continue;
    if (a.ref->strides[d] < span)
      return invalid(cat(a.name, ": strides make the output overlap itself (dimension ", d,
                         " has stride ", a.ref->strides[d], ")"));
    span = a.ref->strides[d] * a.extents[d];
  }
  return {};
}

// What the SM90 kernels read with 16-byte vectors / TMA: unit stride on the last dimension,
// other strides and the base address 16-byte aligned.
Status check_device_layout(const Arg& a) {
  const int64_t elem = static_cast<int64_t>(dtype_size(a.ref->dtype));
  if (a.rank == 4) {  // rows of head-dim vectors (q, k, v, o, states and their gradients)
    if (a.ref->strides[a.rank - 1] != 1)
      return invalid(cat(a.name, ": the last dimension must be contiguous (stride 1), got stride ",
                         a.ref->strides[a.rank - 1]));
    for (int i = 0; i < a.rank - 1; ++i) {
      if (a.extents[i] > 1 && (a.ref->strides[i] * elem) % 16 != 0)
        return invalid(cat(a.name, ": stride ", a.ref->strides[i], " of dimension ", i,
                           " is not a multiple of 16 bytes"));
    }
    if (reinterpret_cast<uintptr_t>(a.ref->data) % 16 != 0)
      return invalid(cat(a.name, ": data pointer is not 16-byte aligned"));
  } else if (reinterpret_cast<uintptr_t>(a.ref->data) % elem != 0) {
    return invalid(cat(a.name, ": data pointer is not aligned to its element size"));
  }
  return {};
}

Status check_tensor(const Arg& a, bool required, bool is_output, Target target) {
  if (!a.ref->present()) {
    return required ? invalid(cat(a.name, ": null pointer (required, shape ", dims_text(a), ")"))
                    : Status{};
  }
  bool same_shape = a.ref->rank == a.rank;
  for (int i = 0; same_shape && i < a.rank; ++i) same_shape = a.ref->sizes[i] == a.extents[i];
  if (!same_shape) {
    std::ostringstream given;
    given << "[";
    for (int i = 0; i < a.ref->rank && i < 4; ++i) given << (i ? ", " : "") << a.ref->sizes[i];
    given << "]";
    return invalid(cat(a.name, ": shape ", given.str(), " does not match the expected ", dims_text(a)));
  }
  if (auto s = check_strides(a, is_output); !s.ok()) return s;
  if (target == Target::kDevice) return check_device_layout(a);
  return {};
}

Status check_dtype(const Arg& a, std::initializer_list<DType> allowed) {
  if (!a.ref->present()) return {};
  for (DType d : allowed)
    if (a.ref->dtype == d) return {};
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  return invalid(cat(a.name, ": dtype must be ", names, ", got ", dtype_name(a.ref->dtype)));
}

Status check_same_dtype(const Arg& a, const Arg& b) {
  if (!a.ref->present() || !b.ref->present() || a.ref->dtype == b.ref->dtype) return {};
  return invalid(cat(a.name, ": dtype ", dtype_name(a.ref->dtype), " differs from ", b.name,
                     "'s ", dtype_name(b.ref->dtype)));
}

// Whether two views with the same strides and element size share an element: element
// a + sum n_i s_i of x meets b + sum m_i s_i of y iff (a - b) - sum k_i s_i lies within one element,
// k_i = m_i - n_i in [-(ex_i - 1), ey_i - 1]. When each stride is at least the reach of the smaller
// ones (views that do not overlap themselves), the remainder after the largest stride must lie in
// (-s_i, s_i), so k_i is within 2 of (a - b) / s_i: a search of at most 5^4 candidates, exact.
// Answers nullopt when that stride condition fails (then only the byte ranges are compared).
std::optional<bool> views_share_element(const Arg& x, const Arg& y) {
  const int64_t elem = static_cast<int64_t>(dtype_size(x.ref->dtype));
  int order[4] = {0, 1, 2, 3};  // dimensions by decreasing stride (insertion sort of <= 4)
  for (int i = 1; i < x.rank; ++i)
    for (int j = i; j > 0 && x.ref->strides[order[j]] > x.ref->strides[order[j - 1]]; --j)
      std::swap(order[j], order[j - 1]);
  int64_t reach = elem;  // bytes touched by the dimensions below, from one element
  for (int j = x.rank - 1; j >= 0; --j) {
    const int d = order[j];
    const int64_t stride = x.ref->strides[d] * elem, extent = std::max(x.extents[d], y.extents[d]);
    if (extent > 1 && stride < reach) return std::nullopt;
    reach += (extent - 1) * stride;
  }
  const int64_t delta = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.ref->data)) -
                        static_cast<int64_t>(reinterpret_cast<uintptr_t>(y.ref->data));
  auto search = [&](auto&& self, int j, int64_t rest) -> bool {
    if (j == x.rank) return rest > -elem && rest < elem;
    const int d = order[j];
    const int64_t stride = x.ref->strides[d] * elem;
    if (stride == 0) return self(self, j + 1, rest);
    const int64_t guess = rest / stride;
    for (int64_t k = guess - 2; k <= guess + 2; ++k)
      if (k > -x.extents[d] && k < y.extents[d] && self(self, j + 1, rest - k * stride)) return true;
    return false;
  };
  return search(search, 0, delta);
}

// Each output must share no byte with any other argument, except a state output that is exactly
// the same view as the state input (in-place update). Views with identical strides are compared
// element by element (interleaved views of one fused buffer, e.g. dq/dk/dv, do not clash).
// `in_place` names the one (input, output) pair allowed to be the identical view, if any.
Status check_overlaps(const std::vector<Arg>& inputs, const std::vector<Arg>& outputs,
                      std::pair<const char*, const char*> in_place = {nullptr, nullptr}) {
  auto same_view = [](const Arg& x, const Arg& y) {
    return x.ref->data == y.ref->data && x.ref->dtype == y.ref->dtype &&
           std::equal(x.ref->strides, x.ref->strides + x.rank, y.ref->strides);
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Arg& out = outputs[i];
    if (!out.ref->present()) continue;
    const auto [lo, hi] = out.byte_range();
    if (lo == hi) continue;
    auto clash = [&](const Arg& other) {
      if (!other.ref->present()) return false;
      const auto [olo, ohi] = other.byte_range();
      if (olo == ohi || !(lo < ohi && olo < hi)) return false;
      if (other.rank == out.rank && dtype_size(other.ref->dtype) == dtype_size(out.ref->dtype) &&
          std::equal(out.ref->strides, out.ref->strides + out.rank, other.ref->strides))
        return views_share_element(out, other).value_or(true);
      return true;
    };
    for (const Arg& in : inputs) {
      if (!clash(in)) continue;
      if (in.name == in_place.first && out.name == in_place.second && same_view(in, out)) continue;
      return invalid(cat(out.name, ": output memory overlaps input ", in.name));
    }
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (clash(outputs[j]))
        return invalid(cat(out.name, ": output memory overlaps output ", outputs[j].name));
    }
  }
  return {};
}

Status check_shape(const Inputs& in, Target target) {
  const Shape& s = in.shape;
  if (s.num_qk_heads <= 0) return invalid(cat("num_qk_heads: must be positive, got ", s.num_qk_heads));
  if (s.num_v_heads <= 0) return invalid(cat("num_v_heads: must be positive, got ", s.num_v_heads));
  if (s.num_v_heads % s.num_qk_heads != 0)
    return invalid(cat("num_v_heads: ", s.num_v_heads, " is not a multiple of num_qk_heads ",
                       s.num_qk_heads));
  if (s.head_dim_k <= 0 || s.head_dim_v <= 0)
    return invalid(cat("head_dim: must be positive, got K=", s.head_dim_k, " V=", s.head_dim_v));
  if (target == Target::kDevice && (s.head_dim_k != 128 || s.head_dim_v != 128))
    return unsupported(cat("head_dim: the SM90 kernels support K = V = 128, got K=", s.head_dim_k,
                           " V=", s.head_dim_v));
  if (s.batch <= 0) return invalid(cat("batch: must be positive, got ", s.batch));
  if (s.seqlen < 0) return invalid(cat("seqlen: must be non-negative, got ", s.seqlen));
  return {};
}

Status check_offsets(const char* name, int64_t num_seqs, int64_t seqlen, auto&& offset_at) {
  if (offset_at(0) != 0) return invalid(cat(name, ": first offset must be 0, got ", offset_at(0)));
  for (int64_t i = 1; i <= num_seqs; ++i) {
    const int64_t a = offset_at(i - 1), b = offset_at(i);
    if (b < 0) return invalid(cat(name, ": offset ", i, " is negative (", b, ")"));
    if (b < a)
      return invalid(cat(name, ": offsets must be non-decreasing, but cu_seqlens[", i, "] = ", b,
                         " < cu_seqlens[", i - 1, "] = ", a));
  }
  if (offset_at(num_seqs) > seqlen)
    return invalid(cat(name, ": last offset ", offset_at(num_seqs), " exceeds the ", seqlen,
                       " tokens of the packed tensors"));
  return {};
}

Status check_varlen(const Inputs& in, Target target) {
  const Varlen& vl = in.varlen;
  if (!vl.present()) {
    if (vl.cu_seqlens_host != nullptr)
      return invalid("cu_seqlens: a host copy was given without the device tensor");
    return {};
  }
  if (in.shape.batch != 1)
    return invalid(cat("cu_seqlens: packed sequences need batch == 1, got batch ", in.shape.batch));
  if (vl.dtype != DType::kI32 && vl.dtype != DType::kI64)
    return invalid(cat("cu_seqlens: dtype must be int32 or int64, got ", dtype_name(vl.dtype)));
  if (vl.num_seqs < 1) return invalid(cat("cu_seqlens: needs at least 2 entries (num_seqs >= 1), got num_seqs ", vl.num_seqs));
  if (vl.dtype == DType::kI32 && in.shape.seqlen > INT32_MAX)
    return invalid("cu_seqlens: int32 offsets cannot address more than 2^31-1 tokens; use int64");
  if (target == Target::kHost) {
    return check_offsets("cu_seqlens", vl.num_seqs, in.shape.seqlen,
                         [&](int64_t i) { return load_index(vl.cu_seqlens, vl.dtype, i); });
  }
  if (vl.cu_seqlens_host != nullptr) {
    return check_offsets("cu_seqlens", vl.num_seqs, in.shape.seqlen,
                         [&](int64_t i) { return vl.cu_seqlens_host[i]; });
  }
  return {};
}

// The arguments every problem reads.
struct InputArgs {
  Arg q, k, v, g, beta, initial_state;
};

InputArgs input_args(const Inputs& in) {
  const Shape& s = in.shape;
  const int64_t B = s.batch, T = s.seqlen, N = in.num_sequences();
  const int64_t rows = in.state_layout == StateLayout::kKV ? s.head_dim_k : s.head_dim_v;
  const int64_t cols = in.state_layout == StateLayout::kKV ? s.head_dim_v : s.head_dim_k;
  return {
      {"q", &in.q, 4, {B, T, s.num_qk_heads, s.head_dim_k}},
      {"k", &in.k, 4, {B, T, s.num_qk_heads, s.head_dim_k}},
      {"v", &in.v, 4, {B, T, s.num_v_heads, s.head_dim_v}},
      {"g", &in.g, 3, {B, T, s.num_v_heads, 1}},
      {"beta", &in.beta, 3, {B, T, s.num_v_heads, 1}},
      {"initial_state", &in.initial_state, 4,
       {in.initial_state_indices.present() ? in.initial_state.sizes[0] : N, s.num_v_heads, rows, cols}},
  };
}

Arg like(const char* name, const TensorRef* ref, const Arg& shape_of) {
  return {name, ref, shape_of.rank, shape_of.extents};
}

Status check_inputs(const Inputs& in, const InputArgs& a, Target target) {
  if (auto s = check_shape(in, target); !s.ok()) return s;
  if (auto s = check_varlen(in, target); !s.ok()) return s;
  for (const Arg* arg : {&a.q, &a.k, &a.v, &a.g, &a.beta})
    if (auto s = check_tensor(*arg, true, false, target); !s.ok()) return s;
  if (auto s = check_tensor(a.initial_state, false, false, target); !s.ok()) return s;

  if (target == Target::kDevice) {
    if (auto s = check_dtype(a.q, {DType::kBF16, DType::kF16}); !s.ok()) return s;
    if (auto s = check_dtype(a.g, {DType::kF32}); !s.ok()) return s;
    if (auto s = check_dtype(a.beta, {DType::kF32, DType::kBF16}); !s.ok()) return s;
    if (auto s = check_dtype(a.initial_state, {DType::kF32, DType::kBF16}); !s.ok()) return s;  // storage
  } else {
    for (const Arg* arg : {&a.q, &a.g, &a.beta, &a.initial_state}) {
      if (arg->ref->present() && !is_float(arg->ref->dtype))
        return invalid(cat(arg->name, ": dtype must be a floating type, got ", dtype_name(arg->ref->dtype)));
    }
  }
  if (auto s = check_same_dtype(a.k, a.q); !s.ok()) return s;
  if (auto s = check_same_dtype(a.v, a.q); !s.ok()) return s;
  if (in.scale.has_value() && !(*in.scale == *in.scale))
    return invalid("scale: is NaN");
  const ContextParallelism& cp = in.context_parallelism;
  if (cp.segment_chunks < 0 || cp.segment_chunks > (int64_t{1} << 24))
    return invalid(cat("cp_segment_chunks: must be in [0, 2^24] (0: the planner's choice), got ", cp.segment_chunks));
  if (!(cp.decay_threshold < 0.f) || cp.decay_threshold < -1e30f)
    return invalid(cat("cp_decay_threshold: must be a finite negative log-decay, got ", cp.decay_threshold));
  return {};
}

}  // namespace

// Slot indices of a state pool: int32 [N]; the pool itself must be given.
Status check_pool_indices(const char* name, const TensorRef& indices, const TensorRef& pool, const char* pool_name,
                          int64_t N, Target target) {
  if (!indices.present()) return {};
  if (target == Target::kHost)
    return unsupported(cat(name, ": state pools are not supported by the float64 reference"));
  if (!pool.present()) return invalid(cat(name, ": given, but there is no ", pool_name, " pool to index"));
  const Arg arg{name, &indices, 1, {N, 1, 1, 1}};
  if (auto s = check_tensor(arg, true, false, target); !s.ok()) return s;
  if (N > 1 && indices.strides[0] != 1)
    return invalid(cat(name, ": must be contiguous (stride 1), got stride ", indices.strides[0]));
  return check_dtype(arg, {DType::kI32});
}

// An fp32 output of contiguous [rows, Hv, R, C] blocks (shard states, the CP cache), its extents in arg.
Status check_fp32_blocks(const Arg& arg, Target target) {
  if (auto st = check_tensor(arg, true, true, target); !st.ok()) return st;
  if (auto st = check_dtype(arg, {DType::kF32}); !st.ok()) return st;
  const int64_t heads = arg.extents[1], R = arg.extents[2], C = arg.extents[3];
  const int64_t* st = arg.ref->strides;
  if (st[3] != 1 || st[2] != C || st[1] != R * C || st[0] != heads * R * C)
    return invalid(cat(arg.name, ": must be contiguous (strides [", heads * R * C, ", ", R * C, ", ", C,
                       ", 1]), got [", st[0], ", ", st[1], ", ", st[2], ", ", st[3], "]"));
  return {};
}

// A shard state output (shard_maps, shard_grad): fp32, contiguous [rows, Hv, K, K] (K == V).
Status check_shard_states(const char* name, const TensorRef& ref, int64_t rows, const Shape& s, Target target) {
  if (s.head_dim_k != s.head_dim_v)
    return unsupported(cat(name, ": a shard's transition M is [K, K] beside its states [K, V], which needs K == V; "
                           "got K=", s.head_dim_k, ", V=", s.head_dim_v));
  return check_fp32_blocks(Arg{name, &ref, 4, {rows, s.num_v_heads, s.head_dim_k, s.head_dim_k}}, target);
}

// One tensor of the CP cache: fp32, contiguous [segments, Hv, K, cols] with segments = its own first
// extent (the runtime checks it against the cut, which the planner gives).
Status check_cp_block(const char* name, const TensorRef& ref, int64_t cols, const Shape& s, Target target, Arg& arg) {
  arg = Arg{name, &ref, 4, {ref.present() && ref.rank == 4 ? ref.sizes[0] : 0, s.num_v_heads, s.head_dim_k, cols}};
  if (ref.rank != 4 || ref.sizes[0] < 1)
    return invalid(cat(name, ": expected [segments >= 1, ", s.num_v_heads, ", ", s.head_dim_k, ", ", cols,
                       "] (forward_cp_cache_shape), got rank ", ref.rank));
  return check_fp32_blocks(arg, target);
}

// The CP cache (cp_states [segments, Hv, K, V] and cp_transitions [segments, Hv, K, K] of the
// forward, given to the backward): both or neither, one row count; only for the GPU kernels and
// without shard phases.
Status check_cp_cache(const TensorRef& states, const TensorRef& transitions, ShardPhase phase, const Shape& s,
                      Target target, Arg& states_arg, Arg& transitions_arg) {
  states_arg = Arg{"cp_states", &states, 4, {0, s.num_v_heads, s.head_dim_k, s.head_dim_v}};
  transitions_arg = Arg{"cp_transitions", &transitions, 4, {0, s.num_v_heads, s.head_dim_k, s.head_dim_k}};
  if (!states.present() && !transitions.present()) return {};
  if (target == Target::kHost) return unsupported("cp_states: the float64 reference runs no intra-card CP");
  if (phase != ShardPhase::kNone) return unsupported("cp_states: not with shard phases (they keep their own segment states)");
  if (states.present() != transitions.present())
    return invalid("cp_states: the CP cache is cp_states and cp_transitions together; give both or neither");
  if (s.head_dim_k != s.head_dim_v)
    return unsupported(cat("cp_transitions: [K, K] transitions beside [K, V] states need K == V; got K=", s.head_dim_k,
                           ", V=", s.head_dim_v));
  if (auto st = check_cp_block("cp_states", states, s.head_dim_v, s, target, states_arg); !st.ok()) return st;
  if (auto st = check_cp_block("cp_transitions", transitions, s.head_dim_k, s, target, transitions_arg); !st.ok())
    return st;
  if (states.sizes[0] != transitions.sizes[0])
    return invalid(cat("cp_transitions: ", transitions.sizes[0], " segments, cp_states has ", states.sizes[0]));
  return {};
}

// The inverse cache (uint8, contiguous [bytes]; the runtime, which knows its layout, checks the size):
// only for the GPU kernels, without shard phases.
Status check_inverse_cache(const TensorRef& cache, ShardPhase phase, Target target, Arg& arg) {
  arg = Arg{"inverse_cache", &cache, 1, {cache.present() && cache.rank == 1 ? cache.sizes[0] : 0, 1, 1, 1}};
  if (!cache.present()) return {};
  if (target == Target::kHost) return unsupported("inverse_cache: the float64 reference forms no chunk inverse");
  if (phase != ShardPhase::kNone)
    return unsupported("inverse_cache: not with shard phases (they keep their own chunk inverse)");
  if (cache.rank != 1 || cache.sizes[0] < 1)
    return invalid(cat("inverse_cache: expected a 1-D uint8 buffer of forward_inverse_cache_bytes bytes, got rank ",
                       cache.rank));
  if (auto st = check_dtype(arg, {DType::kU8}); !st.ok()) return st;
  if (cache.strides[0] != 1)
    return invalid(cat("inverse_cache: must be contiguous (stride 1), got stride ", cache.strides[0]));
  if (reinterpret_cast<uintptr_t>(cache.data) % 256 != 0)
    return invalid("inverse_cache: data pointer is not 256-byte aligned");
  return {};
}

Status check_shard_phase(ShardPhase phase) {
  if (phase != ShardPhase::kNone && phase != ShardPhase::kMaps && phase != ShardPhase::kFinish)
    return invalid(cat("shard_phase: must be 0 (none), 1 (maps) or 2 (finish), got ", static_cast<int32_t>(phase)));
  return {};
}

// Forward shard_phase kMaps: shard_maps is the only output, fp32 contiguous [2 N, Hv, K, K].
Status check_shard_maps(const ForwardProblem& p, const InputArgs& a, Target target) {
  if (p.o.present() || p.final_state.present() || p.final_state_indices.present() || p.checkpoints.present() ||
      p.token_states.present() || p.in.initial_state_indices.present())
    return invalid("shard_phase: 1 (maps) has shard_maps as its only output; o, final_state, final_state_indices, "
                   "checkpoints, token_states and initial_state_indices must be absent");
  const Shape& s = p.in.shape;
  const int64_t rows = 2 * p.in.num_sequences();
  if (auto st = check_shard_states("shard_maps", p.shard_maps, rows, s, target); !st.ok()) return st;
  const Arg maps{"shard_maps", &p.shard_maps, 4, {rows, s.num_v_heads, s.head_dim_k, s.head_dim_k}};
  return check_overlaps({a.q, a.k, a.v, a.g, a.beta, a.initial_state}, {maps}, {});
}

Status validate_inputs(const Inputs& in, Target target) { return check_inputs(in, input_args(in), target); }

Status validate_forward(const ForwardProblem& p, Target target) {
  const InputArgs a = input_args(p.in);
  if (auto s = check_inputs(p.in, a, target); !s.ok()) return s;
  const int64_t N = p.in.num_sequences();
  if (auto s = check_pool_indices("initial_state_indices", p.in.initial_state_indices, p.in.initial_state,
                                  "initial_state", N, target);
      !s.ok())
    return s;
  if (auto s = check_pool_indices("final_state_indices", p.final_state_indices, p.final_state, "final_state", N,
                                  target);
      !s.ok())
    return s;
  Arg checkpoints = like("checkpoints", &p.checkpoints, a.initial_state);
  if (p.checkpoints.present() || p.checkpoint_chunks != 0) {
    if (p.checkpoint_chunks < 1 || p.checkpoint_chunks > (int64_t{1} << 24) || !p.checkpoints.present())
      return invalid(cat("checkpoints: give both the buffer and checkpoint_chunks in [1, 2^24] (got ",
                         p.checkpoint_chunks, ")"));
    const Shape& s = p.in.shape;
    const int64_t per_entry = s.seqlen / 64 / p.checkpoint_chunks;
    checkpoints.extents[0] = p.in.varlen.present() ? per_entry : s.batch * per_entry;
    if (auto st = check_tensor(checkpoints, true, true, target); !st.ok()) return st;
    if (auto st = check_dtype(checkpoints, {DType::kF32}); !st.ok()) return st;
    if (target == Target::kHost) return unsupported("checkpoints: not supported by the float64 reference");
  }
  if (auto s = check_shard_phase(p.shard_phase); !s.ok()) return s;
  Arg inverse_cache{};
  if (auto s = check_inverse_cache(p.inverse_cache, p.shard_phase, target, inverse_cache); !s.ok()) return s;
  if (p.shard_phase == ShardPhase::kMaps) return check_shard_maps(p, a, target);
  if (p.shard_maps.present()) return invalid("shard_maps: an output of shard_phase 1 (maps) only");
  if (p.shard_phase == ShardPhase::kFinish && (p.token_states.present() || p.checkpoints.present()))
    return unsupported("shard_phase: 2 (finish) takes no token_states or checkpoints (a sharded sequence)");
  Arg token_states = like("token_states", &p.token_states, a.initial_state);
  token_states.extents[0] = p.in.shape.batch * p.in.shape.seqlen;
  if (p.token_states.present()) {
    if (auto st = check_tensor(token_states, true, true, target); !st.ok()) return st;
    if (auto st = check_dtype(token_states, {DType::kF32}); !st.ok()) return st;
    if (target == Target::kHost) return unsupported("token_states: not supported by the float64 reference");
    bool decode_sized = p.in.shape.seqlen <= kDecodeTokensPerSequence * (p.in.varlen.present() ? N : 1);
    if (const int64_t* cu = p.in.varlen.present() ? p.in.varlen.cu_seqlens_host : nullptr)
      for (int64_t i = 0; i < N; ++i) decode_sized = decode_sized && cu[i + 1] - cu[i] <= kDecodeMaxTokens;
    if (!decode_sized || p.checkpoints.present())
      return unsupported(cat("token_states: only for decode-sized calls (at most ", kDecodeTokensPerSequence,
                             " tokens per sequence on average, none over ", kDecodeMaxTokens,
                             ", no checkpoints); seqlen is ", p.in.shape.seqlen));
  }
  const Arg o = like("o", &p.o, a.v);
  Arg final_state = like("final_state", &p.final_state, a.initial_state);
  final_state.extents[0] = p.final_state_indices.present() ? p.final_state.sizes[0] : N;
  if (auto s = check_tensor(o, true, true, target); !s.ok()) return s;
  if (auto s = check_tensor(final_state, false, true, target); !s.ok()) return s;
  if (auto s = check_same_dtype(o, a.v); !s.ok()) return s;
  if (target == Target::kDevice) {
    if (auto s = check_dtype(final_state, {DType::kF32, DType::kBF16}); !s.ok()) return s;  // storage
  } else if (final_state.ref->present() && !is_float(final_state.ref->dtype)) {
    return invalid("final_state: dtype must be a floating type");
  }
  Arg cp_states{}, cp_transitions{};
  if (auto s = check_cp_cache(p.cp_states, p.cp_transitions, p.shard_phase, p.in.shape, target, cp_states,
                              cp_transitions);
      !s.ok())
    return s;
  const Arg initial_indices{"initial_state_indices", &p.in.initial_state_indices, 1, {N, 1, 1, 1}};
  const Arg final_indices{"final_state_indices", &p.final_state_indices, 1, {N, 1, 1, 1}};
  return check_overlaps({a.q, a.k, a.v, a.g, a.beta, a.initial_state, initial_indices, final_indices},
                        {o, final_state, checkpoints, token_states, cp_states, cp_transitions, inverse_cache},
                        {a.initial_state.name, final_state.name});
}

// Backward shard_phase kMaps: d_o in, shard_grad out, nothing else.
Status check_shard_grad(const BackwardProblem& p, const InputArgs& a, Target target) {
  if (p.d_final_state.present() || p.dq.present() || p.dk.present() || p.dv.present() || p.dg.present() ||
      p.dbeta.present() || p.d_initial_state.present() || p.in.initial_state.present())
    return invalid("shard_phase: 1 (maps) of the backward reads d_o and writes only shard_grad; dht, dq, dk, dv, "
                   "dg, dbeta, dh0 and initial_state must be absent");
  const Arg d_o = like("do", &p.d_o, a.v);
  if (auto s = check_tensor(d_o, true, false, target); !s.ok()) return s;
  if (auto s = check_same_dtype(d_o, a.v); !s.ok()) return s;
  if (auto s = check_shard_states("shard_grad", p.shard_grad, p.in.num_sequences(), p.in.shape, target); !s.ok())
    return s;
  const Arg grad{"shard_grad", &p.shard_grad, 4,
                 {p.in.num_sequences(), p.in.shape.num_v_heads, p.in.shape.head_dim_k, p.in.shape.head_dim_k}};
  return check_overlaps({a.q, a.k, a.v, a.g, a.beta, d_o}, {grad}, {});
}

Status validate_backward(const BackwardProblem& p, Target target) {
  if (p.in.initial_state_indices.present())
    return unsupported("initial_state_indices: state pools are forward-only (serving); pass the states");
  if (target == Target::kDevice && p.in.initial_state.present() && p.in.initial_state.dtype != DType::kF32)
    return unsupported("initial_state: the backward takes fp32 states (bf16 state storage is forward-only)");
  const InputArgs a = input_args(p.in);
  if (auto s = check_inputs(p.in, a, target); !s.ok()) return s;
  if (auto s = check_shard_phase(p.shard_phase); !s.ok()) return s;
  Arg cp_states{}, cp_transitions{};
  if (auto s = check_cp_cache(p.cp_states, p.cp_transitions, p.shard_phase, p.in.shape, target, cp_states,
                              cp_transitions);
      !s.ok())
    return s;
  if (p.cp_states.present() != (p.cp_segment_chunks != 0) || p.cp_segment_chunks < 0)
    return invalid(cat("cp_states: give both the forward's CP cache and its cut cp_segment_chunks >= 1 "
                       "(forward_cp_cache_shape), or neither; got cp_segment_chunks ", p.cp_segment_chunks));
  Arg inverse_cache{};
  if (auto s = check_inverse_cache(p.inverse_cache, p.shard_phase, target, inverse_cache); !s.ok()) return s;
  if (p.inverse_cache.present() && p.inverse_fp32)
    return unsupported("inverse_cache: holds the fp16-merged chunk inverse; not with inverse_fp32");
  if (p.shard_phase == ShardPhase::kMaps) return check_shard_grad(p, a, target);
  if (p.shard_grad.present()) return invalid("shard_grad: an output of shard_phase 1 (maps) only");
  const Arg d_o = like("do", &p.d_o, a.v);
  const Arg d_final_state = like("dht", &p.d_final_state, a.initial_state);
  const Arg dq = like("dq", &p.dq, a.q);
  const Arg dk = like("dk", &p.dk, a.k);
  const Arg dv = like("dv", &p.dv, a.v);
  const Arg dg = like("dg", &p.dg, a.g);
  const Arg dbeta = like("dbeta", &p.dbeta, a.beta);
  const Arg dh0 = like("dh0", &p.d_initial_state, a.initial_state);

  if (auto s = check_tensor(d_o, true, false, target); !s.ok()) return s;
  if (auto s = check_tensor(d_final_state, false, false, target); !s.ok()) return s;
  for (const Arg* out : {&dq, &dk, &dv, &dg, &dbeta})
    if (auto s = check_tensor(*out, true, true, target); !s.ok()) return s;
  if (p.in.initial_state.present() != p.d_initial_state.present()) {
    return invalid(p.in.initial_state.present()
                       ? "dh0: required (null) because an initial_state was given"
                       : "dh0: given, but there is no initial_state to differentiate");
  }
  if (auto s = check_tensor(dh0, false, true, target); !s.ok()) return s;

  if (auto s = check_same_dtype(d_o, a.v); !s.ok()) return s;
  if (auto s = check_same_dtype(dq, a.q); !s.ok()) return s;
  if (auto s = check_same_dtype(dk, a.k); !s.ok()) return s;
  if (auto s = check_same_dtype(dv, a.v); !s.ok()) return s;
  if (auto s = check_same_dtype(dbeta, a.beta); !s.ok()) return s;
  if (target == Target::kDevice) {
    if (auto s = check_dtype(dg, {DType::kF32}); !s.ok()) return s;
    if (auto s = check_dtype(d_final_state, {DType::kF32}); !s.ok()) return s;
    if (auto s = check_dtype(dh0, {DType::kF32}); !s.ok()) return s;
  } else {
    for (const Arg* arg : {&dg, &d_final_state, &dh0})
      if (arg->ref->present() && !is_float(arg->ref->dtype))
        return invalid(cat(arg->name, ": dtype must be a floating type"));
  }
  // cp_transitions is an output too: the backward adds the transitions the forward did not form
  return check_overlaps({a.q, a.k, a.v, a.g, a.beta, a.initial_state, d_o, d_final_state, cp_states, inverse_cache},
                        {dq, dk, dv, dg, dbeta, dh0, cp_transitions});
}

}  // namespace flashgdn::detail

namespace flashgdn {

Status validate_forward(const ForwardProblem& problem) {
  return detail::validate_forward(problem, detail::Target::kDevice);
}
Status validate_backward(const BackwardProblem& problem) {
  return detail::validate_backward(problem, detail::Target::kDevice);
}

}  // namespace flashgdn
