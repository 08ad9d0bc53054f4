// Validation of the GPU entry points: every bad argument gives a clear error naming it.
// Pointers here address a host arena: validation must never dereference tensor data.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "flashgdn/flashgdn.h"

namespace flashgdn {
namespace {

constexpr int64_t kB = 2, kT = 100, kHqk = 2, kHv = 4, kD = 128;

// Hands out disjoint, 256-byte aligned addresses inside one host arena.
class Arena {
 public:
  void* take(size_t bytes) {
    const size_t at = used_;
    used_ += (bytes + 255) / 256 * 256;
    EXPECT_LE(used_, storage_.size());
    return storage_.data() + at;
  }
  std::byte* base() { return storage_.data(); }

 private:
  alignas(256) std::vector<std::byte> storage_ = std::vector<std::byte>(8 << 20);
  size_t used_ = 256;  // storage_.data() itself is 16-byte aligned at least; keep offset aligned
};

TensorRef tensor(Arena& arena, DType dtype, std::initializer_list<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t e : sizes) n *= e;
  return TensorRef::contiguous(arena.take(static_cast<size_t>(n) * dtype_size(dtype)), dtype, sizes);
}

struct Fixture {
  Arena arena;
  ForwardProblem fwd;
  BackwardProblem bwd;
  std::vector<int64_t> cu_host;

  Fixture() {
    Inputs& in = fwd.in;
    in.shape = {kB, kT, kHqk, kHv, kD, kD};
    in.q = tensor(arena, DType::kBF16, {kB, kT, kHqk, kD});
    in.k = tensor(arena, DType::kBF16, {kB, kT, kHqk, kD});
    in.v = tensor(arena, DType::kBF16, {kB, kT, kHv, kD});
    in.g = tensor(arena, DType::kF32, {kB, kT, kHv});
    in.beta = tensor(arena, DType::kF32, {kB, kT, kHv});
    in.initial_state = tensor(arena, DType::kF32, {kB, kHv, kD, kD});
    fwd.o = tensor(arena, DType::kBF16, {kB, kT, kHv, kD});
    fwd.final_state = tensor(arena, DType::kF32, {kB, kHv, kD, kD});

    bwd.in = in;
    bwd.d_o = tensor(arena, DType::kBF16, {kB, kT, kHv, kD});
    bwd.d_final_state = tensor(arena, DType::kF32, {kB, kHv, kD, kD});
    bwd.dq = tensor(arena, DType::kBF16, {kB, kT, kHqk, kD});
    bwd.dk = tensor(arena, DType::kBF16, {kB, kT, kHqk, kD});
    bwd.dv = tensor(arena, DType::kBF16, {kB, kT, kHv, kD});
    bwd.dg = tensor(arena, DType::kF32, {kB, kT, kHv});
    bwd.dbeta = tensor(arena, DType::kF32, {kB, kT, kHv});
    bwd.d_initial_state = tensor(arena, DType::kF32, {kB, kHv, kD, kD});
  }

  // Switch to packed varlen: batch 1, lengths given.
  void make_varlen(std::vector<int64_t> offsets, DType dtype = DType::kI32) {
    cu_host = std::move(offsets);
    for (TensorRef* t : {&fwd.in.q, &fwd.in.k, &fwd.in.v, &fwd.in.g, &fwd.in.beta, &fwd.o,
                         &bwd.in.q, &bwd.in.k, &bwd.in.v, &bwd.in.g, &bwd.in.beta, &bwd.d_o,
                         &bwd.dq, &bwd.dk, &bwd.dv, &bwd.dg, &bwd.dbeta})
      t->sizes[0] = 1;  // same memory, viewed as one packed batch entry
    for (Inputs* in : {&fwd.in, &bwd.in}) {
      in->shape.batch = 1;
      in->varlen.cu_seqlens = arena.take(cu_host.size() * 8);
      in->varlen.dtype = dtype;
      in->varlen.num_seqs = static_cast<int64_t>(cu_host.size()) - 1;
      in->varlen.cu_seqlens_host = cu_host.data();
    }
    fwd.in.initial_state.data = nullptr;
    fwd.final_state.data = nullptr;
    bwd.in.initial_state.data = nullptr;
    bwd.d_final_state.data = nullptr;
    bwd.d_initial_state.data = nullptr;
  }
};

// The error's code and that its message starts with the argument's name.
void expect_error(const Status& s, StatusCode code, const std::string& argument) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_EQ(s.message().rfind(argument + ":", 0), 0u)
      << "message should name '" << argument << "': " << s.message();
}

TEST(Validate, ValidProblemsPass) {
  Fixture f;
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  EXPECT_TRUE(validate_backward(f.bwd).ok()) << validate_backward(f.bwd).message();
  f.fwd.final_state = f.fwd.in.initial_state;  // exact in-place state update is allowed
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  f.make_varlen({0, 0, 1, 64, 100});
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  EXPECT_TRUE(validate_backward(f.bwd).ok()) << validate_backward(f.bwd).message();
}

TEST(Validate, NullPointers) {
  for (const char* name : {"q", "k", "v", "g", "beta", "o"}) {
    Fixture f;
    TensorRef* refs[] = {&f.fwd.in.q, &f.fwd.in.k, &f.fwd.in.v, &f.fwd.in.g, &f.fwd.in.beta, &f.fwd.o};
    const std::string names[] = {"q", "k", "v", "g", "beta", "o"};
    for (int i = 0; i < 6; ++i)
      if (names[i] == name) refs[i]->data = nullptr;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, name);
  }
  Fixture f;
  f.bwd.dg.data = nullptr;
  expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dg");
  Fixture h;
  h.bwd.d_o.data = nullptr;
  expect_error(validate_backward(h.bwd), StatusCode::kInvalidArgument, "do");
}

TEST(Validate, HeadCountsAndDims) {
  Fixture f;
  f.fwd.in.shape.num_v_heads = 3;  // not a multiple of 2
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "num_v_heads");
  Fixture g;
  g.fwd.in.shape.num_qk_heads = 0;
  expect_error(validate_forward(g.fwd), StatusCode::kInvalidArgument, "num_qk_heads");
  Fixture h;
  h.fwd.in.shape.head_dim_k = 64;
  h.fwd.in.q.sizes[3] = h.fwd.in.k.sizes[3] = 64;
  h.fwd.in.initial_state.data = h.fwd.final_state.data = nullptr;
  expect_error(validate_forward(h.fwd), StatusCode::kNotSupported, "head_dim");
  EXPECT_TRUE(detail::validate_forward(h.fwd, detail::Target::kHost).ok());
  Fixture b;
  b.fwd.in.shape.batch = 0;
  expect_error(validate_forward(b.fwd), StatusCode::kInvalidArgument, "batch");
}

TEST(Validate, Dtypes) {
  Fixture f;
  f.fwd.in.q.dtype = DType::kF32;
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "q");
  Fixture g;
  g.fwd.in.k.dtype = DType::kF16;
  expect_error(validate_forward(g.fwd), StatusCode::kInvalidArgument, "k");
  Fixture h;
  h.fwd.in.g.dtype = DType::kBF16;
  expect_error(validate_forward(h.fwd), StatusCode::kInvalidArgument, "g");
  Fixture b;
  b.fwd.in.beta.dtype = DType::kF16;
  expect_error(validate_forward(b.fwd), StatusCode::kInvalidArgument, "beta");
  Fixture s;
  s.fwd.in.initial_state.dtype = DType::kF16;
  expect_error(validate_forward(s.fwd), StatusCode::kInvalidArgument, "initial_state");
  Fixture bf16_states;  // bf16 state storage: the forward reads and writes it, the backward refuses it
  bf16_states.fwd.in.initial_state.dtype = DType::kBF16;
  bf16_states.fwd.final_state.dtype = DType::kBF16;
  EXPECT_TRUE(validate_forward(bf16_states.fwd).ok()) << validate_forward(bf16_states.fwd).message();
  bf16_states.bwd.in.initial_state.dtype = DType::kBF16;
  expect_error(validate_backward(bf16_states.bwd), StatusCode::kNotSupported, "initial_state");
  Fixture o;
  o.fwd.o.dtype = DType::kF16;
  expect_error(validate_forward(o.fwd), StatusCode::kInvalidArgument, "o");
  Fixture d;
  d.bwd.dg.dtype = DType::kBF16;
  expect_error(validate_backward(d.bwd), StatusCode::kInvalidArgument, "dg");
  Fixture e;
  e.bwd.dbeta.dtype = DType::kBF16;  // must match beta (fp32)
  expect_error(validate_backward(e.bwd), StatusCode::kInvalidArgument, "dbeta");
  Fixture ok;
  ok.fwd.in.beta.dtype = DType::kBF16;  // bf16 beta is accepted
  EXPECT_TRUE(validate_forward(ok.fwd).ok());
}

TEST(Validate, CuSeqlens) {
  {
    Fixture f;
    f.make_varlen({0, 10, 5, 100});
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cu_seqlens");
    EXPECT_NE(f.fwd.in.varlen.cu_seqlens_host, nullptr);
  }
  {
    Fixture f;
    f.make_varlen({0, 10, 101});  // beyond T = 100
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cu_seqlens");
  }
  {
    Fixture f;
    f.make_varlen({1, 10, 20});  // must start at 0
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cu_seqlens");
  }
  {
    Fixture f;
    f.make_varlen({0, -3, 20});
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cu_seqlens");
  }
  {
    Fixture f;
    f.make_varlen({0, 10, 20});
    f.fwd.in.shape.batch = 2;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cu_seqlens");
  }
  {
    Fixture f;
    f.make_varlen({0, 10, 20}, DType::kF32);
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cu_seqlens");
  }
  {
    Fixture f;  // without a host copy the offsets cannot be read: structure is still checked
    f.make_varlen({0, 10, 5});
    f.fwd.in.varlen.cu_seqlens_host = nullptr;
    EXPECT_TRUE(validate_forward(f.fwd).ok());
  }
}

TEST(Validate, StridesAndAlignment) {
  {
    Fixture f;
    f.fwd.in.q.strides[3] = 2;  // head dim must be contiguous
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "q");
  }
  {
    Fixture f;
    f.fwd.in.v.data = static_cast<std::byte*>(f.fwd.in.v.data) + 2;  // not 16-byte aligned
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "v");
  }
  {
    Fixture f;
    f.fwd.in.k.strides[2] = 130;  // 260 bytes: not a multiple of 16
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "k");
  }
  {
    Fixture f;
    f.fwd.o.strides[1] = 0;  // every token writes the same row
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "o");
  }
  {
    Fixture f;
    f.fwd.in.g.strides[1] = -1;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "g");
  }
  {
    Fixture f;  // a strided slice of a wider tensor is fine (q viewed inside a fused qkv buffer)
    f.fwd.in.q.strides[1] = 3 * kHqk * kD;
    f.fwd.in.q.strides[0] = kT * 3 * kHqk * kD;
    f.fwd.in.q.data = f.arena.take(kB * kT * 3 * kHqk * kD * 2);
    EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  }
}

TEST(Validate, OverlappingOutputs) {
  {
    Fixture f;
    f.fwd.o.data = f.fwd.in.v.data;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "o");
  }
  {
    Fixture f;  // final state overlapping the initial state with a different (transposed) view
    f.fwd.final_state = f.fwd.in.initial_state;
    std::swap(f.fwd.final_state.strides[2], f.fwd.final_state.strides[3]);
    f.fwd.final_state.strides[3] = 1;
    f.fwd.final_state.strides[2] = 2 * kD;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "final_state");
  }
  {
    Fixture f;
    f.bwd.dk.data = f.bwd.dq.data;
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dq");
  }
  {
    Fixture f;
    f.bwd.dv.data = f.bwd.d_o.data;
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dv");
  }
}

// dq, dk, dv as interleaved head slices of one fused [B, T, (2 Hqk + Hv) D] gradient buffer: the
// byte ranges intersect, the elements do not.
void fuse_grads(Fixture& f, int64_t dk_shift) {
  constexpr int64_t width = (2 * kHqk + kHv) * kD;
  auto* base = static_cast<std::byte*>(f.arena.take(kB * kT * width * 2));
  auto view = [&](TensorRef& t, int64_t offset) {
    t.data = base + offset * 2;
    t.strides[0] = kT * width;
    t.strides[1] = width;
  };
  view(f.bwd.dq, 0);
  view(f.bwd.dk, kHqk * kD + dk_shift);
  view(f.bwd.dv, 2 * kHqk * kD);
}

TEST(Validate, StatePools) {
  {
    Fixture f;  // initial states read from a pool of 7 slots, final states written to a pool of 5
    f.fwd.in.initial_state = tensor(f.arena, DType::kF32, {7, kHv, kD, kD});
    f.fwd.in.initial_state_indices = tensor(f.arena, DType::kI32, {kB});
    f.fwd.final_state = tensor(f.arena, DType::kF32, {5, kHv, kD, kD});
    f.fwd.final_state_indices = tensor(f.arena, DType::kI32, {kB});
    EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
    f.fwd.final_state = f.fwd.in.initial_state;  // one pool, read and written in place
    EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  }
  {
    Fixture f;
    f.fwd.in.initial_state_indices = tensor(f.arena, DType::kI64, {kB});
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "initial_state_indices");
  }
  {
    Fixture f;
    f.fwd.final_state_indices = tensor(f.arena, DType::kI32, {kB + 1});
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "final_state_indices");
  }
  {
    Fixture f;  // indices without a pool to index
    f.fwd.in.initial_state = {};
    f.fwd.in.initial_state_indices = tensor(f.arena, DType::kI32, {kB});
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "initial_state_indices");
  }
  {
    Fixture f;  // without indices the states must have one row per sequence
    f.fwd.final_state = tensor(f.arena, DType::kF32, {5, kHv, kD, kD});
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "final_state");
  }
  {
    Fixture f;  // every second element of an index buffer: the kernels read indices contiguously
    f.fwd.in.initial_state_indices = tensor(f.arena, DType::kI32, {2 * kB});
    f.fwd.in.initial_state_indices.sizes[0] = kB;
    f.fwd.in.initial_state_indices.strides[0] = 2;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "initial_state_indices");
  }
  {
    Fixture f;  // indices written by the call
    f.fwd.final_state_indices = tensor(f.arena, DType::kI32, {kB});
    f.fwd.o.data = f.fwd.final_state_indices.data;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "o");
  }
  {
    Fixture f;  // the float64 reference and the backward take no pools
    f.fwd.in.initial_state_indices = tensor(f.arena, DType::kI32, {kB});
    expect_error(detail::validate_forward(f.fwd, detail::Target::kHost), StatusCode::kNotSupported,
                 "initial_state_indices");
    f.bwd.in.initial_state_indices = f.fwd.in.initial_state_indices;
    expect_error(validate_backward(f.bwd), StatusCode::kNotSupported, "initial_state_indices");
  }
}

TEST(Validate, StateCheckpoints) {
  {
    Fixture f;  // every 128 tokens of T = 100: no boundary fits, zero rows per sequence
    f.fwd.checkpoint_chunks = 2;
    f.fwd.checkpoints = tensor(f.arena, DType::kF32, {0, kHv, kD, kD});
    EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
    f.fwd.checkpoint_chunks = 1;  // every 64 tokens: one row per sequence
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "checkpoints");
    f.fwd.checkpoints = tensor(f.arena, DType::kF32, {kB, kHv, kD, kD});
    EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
    f.fwd.checkpoint_chunks = 0;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "checkpoints");
    f.fwd.checkpoint_chunks = int64_t{1} << 58;  // 64 * n would overflow
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "checkpoints");
  }
}

// A tensor far above the arena (validation never dereferences), for outputs too large for it.
TensorRef far_tensor(DType dtype, std::initializer_list<int64_t> sizes) {
  return TensorRef::contiguous(reinterpret_cast<void*>(uintptr_t{1} << 46), dtype, sizes);
}

TEST(Validate, TokenStates) {
  Fixture f;  // T = 100 tokens per sequence: not a decode-sized call
  f.fwd.token_states = far_tensor(DType::kF32, {kB * kT, kHv, kD, kD});
  expect_error(validate_forward(f.fwd), StatusCode::kNotSupported, "token_states");
  Fixture d;  // 4 tokens per sequence: decode-sized
  d.fwd.in.shape.seqlen = 4;
  for (TensorRef* t : {&d.fwd.in.q, &d.fwd.in.k, &d.fwd.in.v, &d.fwd.o, &d.fwd.in.g, &d.fwd.in.beta}) {
    const int64_t old_t = t->sizes[1];
    t->sizes[1] = 4;
    t->strides[0] = t->strides[0] / old_t * 4;
  }
  d.fwd.token_states = far_tensor(DType::kF32, {kB * 4, kHv, kD, kD});
  EXPECT_TRUE(validate_forward(d.fwd).ok()) << validate_forward(d.fwd).message();
  d.fwd.token_states.dtype = DType::kBF16;
  expect_error(validate_forward(d.fwd), StatusCode::kInvalidArgument, "token_states");
  d.fwd.token_states = far_tensor(DType::kF32, {kB * 4 - 1, kHv, kD, kD});
  expect_error(validate_forward(d.fwd), StatusCode::kInvalidArgument, "token_states");
}

TEST(Validate, ShardPhases) {
  Fixture f;
  f.fwd.shard_phase = ShardPhase::kFinish;  // the plain problem, as the second phase
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  f.fwd.checkpoint_chunks = 1;
  f.fwd.checkpoints = tensor(f.arena, DType::kF32, {kB, kHv, kD, kD});
  expect_error(validate_forward(f.fwd), StatusCode::kNotSupported, "shard_phase");
  f.fwd.checkpoint_chunks = 0;
  f.fwd.checkpoints = {};
  f.fwd.shard_maps = tensor(f.arena, DType::kF32, {2 * kB, kHv, kD, kD});
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_maps");  // only phase 1 writes it

  f.fwd.shard_phase = ShardPhase::kMaps;  // o and final_state still given
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_phase");
  f.fwd.o = {};
  f.fwd.final_state = {};
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  const TensorRef maps = f.fwd.shard_maps;
  f.fwd.shard_maps = {};
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_maps");
  f.fwd.shard_maps = tensor(f.arena, DType::kF32, {kB, kHv, kD, kD});  // E only
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_maps");
  f.fwd.shard_maps = maps;
  f.fwd.shard_maps.dtype = DType::kBF16;
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_maps");
  f.fwd.shard_maps = maps;
  std::swap(f.fwd.shard_maps.strides[2], f.fwd.shard_maps.strides[3]);  // transposed
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_maps");
  f.fwd.shard_maps = maps;
  f.fwd.shard_maps.data = f.fwd.in.v.data;  // over an input
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_maps");
  f.fwd.shard_maps = maps;
  f.fwd.shard_phase = static_cast<ShardPhase>(3);
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "shard_phase");

  // The backward's phase 1 reads d_o and writes only shard_grad [N, Hv, K, V].
  BackwardProblem& b = f.bwd;
  b.shard_grad = tensor(f.arena, DType::kF32, {kB, kHv, kD, kD});
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "shard_grad");  // not phase 1
  b.shard_phase = ShardPhase::kMaps;
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "shard_phase");  // gradients given
  b.d_final_state = b.dq = b.dk = b.dv = b.dg = b.dbeta = b.d_initial_state = b.in.initial_state = {};
  EXPECT_TRUE(validate_backward(b).ok()) << validate_backward(b).message();
  const TensorRef grad = b.shard_grad;
  b.shard_grad = tensor(f.arena, DType::kF32, {2 * kB, kHv, kD, kD});
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "shard_grad");
  b.shard_grad = grad;
  b.d_o = {};
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "do");
}

TEST(Validate, CpCache) {
  Fixture f;
  const TensorRef states = tensor(f.arena, DType::kF32, {3, kHv, kD, kD});
  const TensorRef transitions = tensor(f.arena, DType::kF32, {3, kHv, kD, kD});
  f.fwd.cp_states = states;  // rows are the runtime's to check against the cut
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_states");  // without transitions
  f.fwd.cp_transitions = transitions;
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  f.fwd.cp_states.dtype = DType::kBF16;
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_states");
  f.fwd.cp_states = tensor(f.arena, DType::kF32, {3, kHv + 1, kD, kD});
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_states");
  f.fwd.cp_states = tensor(f.arena, DType::kF32, {3, kHv, kD});
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_states");
  f.fwd.cp_states = states;
  f.fwd.cp_transitions = tensor(f.arena, DType::kF32, {2, kHv, kD, kD});  // another row count
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_transitions");
  f.fwd.cp_transitions = transitions;
  std::swap(f.fwd.cp_transitions.strides[2], f.fwd.cp_transitions.strides[3]);  // transposed
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_transitions");
  f.fwd.cp_transitions = transitions;
  f.fwd.cp_states = tensor(f.arena, DType::kF32, {1, kHv, kD, kD});
  f.fwd.cp_transitions = tensor(f.arena, DType::kF32, {1, kHv, kD, kD});
  f.fwd.cp_states.data = f.fwd.in.initial_state.data;  // within an input
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_states");
  f.fwd.cp_states = states;
  f.fwd.cp_transitions = transitions;
  expect_error(detail::validate_forward(f.fwd, detail::Target::kHost), StatusCode::kNotSupported, "cp_states");
  f.fwd.shard_phase = ShardPhase::kFinish;
  expect_error(validate_forward(f.fwd), StatusCode::kNotSupported, "cp_states");

  BackwardProblem& b = f.bwd;
  b.cp_states = states;  // without its cut
  b.cp_transitions = transitions;
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "cp_states");
  b.cp_segment_chunks = 4;
  EXPECT_TRUE(validate_backward(b).ok()) << validate_backward(b).message();
  b.cp_transitions = {};
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "cp_states");
  b.cp_transitions = transitions;
  b.cp_states = {};  // a cut without the cache
  b.cp_transitions = {};
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "cp_states");
  b.cp_states = states;
  b.cp_transitions = transitions;
  b.cp_segment_chunks = -4;
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "cp_states");
  b.cp_segment_chunks = 4;
  b.cp_states = tensor(f.arena, DType::kF32, {1, kHv, kD, kD});
  b.cp_transitions = tensor(f.arena, DType::kF32, {1, kHv, kD, kD});
  b.cp_transitions.data = b.in.initial_state.data;  // the backward writes transitions: an output within an input
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "cp_transitions");
  b.cp_states = states;
  b.cp_transitions = transitions;
  b.shard_phase = ShardPhase::kFinish;
  expect_error(validate_backward(b), StatusCode::kNotSupported, "cp_states");
  b.shard_phase = ShardPhase::kNone;
  expect_error(detail::validate_backward(b, detail::Target::kHost), StatusCode::kNotSupported, "cp_states");
}

// A uint8 buffer of `bytes` at a 256-byte aligned address inside the arena (its own addresses are
// 256 bytes apart, not necessarily aligned).
TensorRef aligned_bytes(Arena& arena, int64_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(arena.take(static_cast<size_t>(bytes) + 256));
  return TensorRef::contiguous(reinterpret_cast<void*>((at + 255) / 256 * 256), DType::kU8, {bytes});
}

TEST(Validate, InverseCache) {
  Fixture f;
  const TensorRef cache = aligned_bytes(f.arena, 4096);
  f.fwd.inverse_cache = cache;  // its size is the runtime's to check (it knows the layout)
  EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  EXPECT_STREQ(dtype_name(DType::kU8), "uint8");
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  f.fwd.inverse_cache.dtype = DType::kF32;
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "inverse_cache");
  f.fwd.inverse_cache = cache;
  f.fwd.inverse_cache.data = static_cast<std::byte*>(cache.data) + 16;
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "inverse_cache");
  f.fwd.inverse_cache = TensorRef::contiguous(cache.data, DType::kU8, {2, 2048});
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "inverse_cache");
  f.fwd.inverse_cache = TensorRef::strided(cache.data, DType::kU8, {2048}, {2});
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "inverse_cache");
  const auto q_at = reinterpret_cast<uintptr_t>(f.fwd.in.q.data);  // an output within an input
  f.fwd.inverse_cache = TensorRef::contiguous(reinterpret_cast<void*>((q_at + 255) / 256 * 256), DType::kU8, {1024});
  expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "inverse_cache");
  f.fwd.inverse_cache = cache;
  expect_error(detail::validate_forward(f.fwd, detail::Target::kHost), StatusCode::kNotSupported, "inverse_cache");
  for (ShardPhase phase : {ShardPhase::kMaps, ShardPhase::kFinish}) {
    f.fwd.shard_phase = phase;
    expect_error(validate_forward(f.fwd), StatusCode::kNotSupported, "inverse_cache");
  }

  BackwardProblem& b = f.bwd;
  b.inverse_cache = cache;  // read only: an input
  EXPECT_TRUE(validate_backward(b).ok()) << validate_backward(b).message();
  b.inverse_fp32 = true;
  expect_error(validate_backward(b), StatusCode::kNotSupported, "inverse_cache");
  b.inverse_fp32 = false;
  const TensorRef dq = b.dq;
  b.dq.data = cache.data;
  expect_error(validate_backward(b), StatusCode::kInvalidArgument, "dq");
  b.dq = dq;
  b.shard_phase = ShardPhase::kFinish;
  expect_error(validate_backward(b), StatusCode::kNotSupported, "inverse_cache");
  b.shard_phase = ShardPhase::kNone;
  expect_error(detail::validate_backward(b, detail::Target::kHost), StatusCode::kNotSupported, "inverse_cache");
}

TEST(Validate, ContextParallelismOptions) {
  {
    Fixture f;
    f.fwd.in.context_parallelism = {ContextParallel::kOn, 8, -12.f};
    EXPECT_TRUE(validate_forward(f.fwd).ok()) << validate_forward(f.fwd).message();
  }
  {
    Fixture f;
    f.fwd.in.context_parallelism.segment_chunks = -1;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_segment_chunks");
  }
  for (float threshold : {0.f, 1.f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Fixture f;
    f.fwd.in.context_parallelism.decay_threshold = threshold;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "cp_decay_threshold");
  }
}

TEST(Validate, InterleavedGradientViews) {
  {
    Fixture f;
    fuse_grads(f, 0);
    EXPECT_TRUE(validate_backward(f.bwd).ok()) << validate_backward(f.bwd).message();
  }
  {
    Fixture f;  // dk shifted half a head down: its first head meets dq's last
    fuse_grads(f, -kD / 2);
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dq");
    EXPECT_NE(validate_backward(f.bwd).message().find("overlaps output dk"), std::string::npos);
  }
  {
    Fixture f;  // dk shifted 8 elements (16 bytes) up: its last head meets dv's first
    fuse_grads(f, 8);
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dk");
    EXPECT_NE(validate_backward(f.bwd).message().find("overlaps output dv"), std::string::npos);
  }
}

TEST(Validate, ShapeMismatch) {
  {
    Fixture f;  // a state of another head dim
    f.fwd.final_state.sizes[3] = 64;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "final_state");
  }
  {
    Fixture f;  // states for one sequence too few
    f.fwd.in.initial_state.sizes[0] = kB - 1;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "initial_state");
  }
  {
    Fixture f;  // v with the q/k head count
    f.fwd.in.v.sizes[2] = kHqk;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "v");
  }
  {
    Fixture f;  // g given as [B, T, Hv, 1]
    f.fwd.in.g.rank = 4;
    f.fwd.in.g.sizes[3] = 1;
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "g");
  }
  {
    Fixture f;
    f.bwd.dq.sizes[1] = kT + 1;
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dq");
  }
}

TEST(Validate, StateShapes) {
  {
    Fixture f;
    f.bwd.d_initial_state.data = nullptr;  // initial_state given: dh0 required
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dh0");
  }
  {
    Fixture f;
    f.bwd.in.initial_state.data = nullptr;  // no initial state: dh0 must be absent
    expect_error(validate_backward(f.bwd), StatusCode::kInvalidArgument, "dh0");
  }
  {
    Fixture f;  // a state row stride that does not fit a V-first 128x128 state still aligned: ok;
    f.fwd.in.initial_state.strides[3] = 2;  // but the last dimension must be contiguous
    expect_error(validate_forward(f.fwd), StatusCode::kInvalidArgument, "initial_state");
  }
}

TEST(Validate, WorkspaceQueryAndLaunchReportErrors) {
  Fixture f;
  std::size_t bytes = 1;
  EXPECT_EQ(forward_workspace_size(f.fwd, nullptr).code(), StatusCode::kInvalidArgument);
  f.fwd.in.q.data = nullptr;
  expect_error(forward_workspace_size(f.fwd, &bytes), StatusCode::kInvalidArgument, "q");
  expect_error(forward(f.fwd, nullptr, 0, nullptr), StatusCode::kInvalidArgument, "q");
}

}  // namespace
}  // namespace flashgdn
