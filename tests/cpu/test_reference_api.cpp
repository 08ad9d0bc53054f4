// The public entry flashgdn::reference::forward on strided host tensors: batch and varlen mode,
// grouped value heads, both state layouts, non-contiguous views, bf16/f16/f32/f64 storage, padding
// tokens, in-place states, against a per-head token recurrence built here from the stored values;
// the chunked and CP forms through the same entry; and the invalid-argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/host_dtype.h"
#include "flashgdn/reference.h"
#include "reference_fixtures.h"

namespace flashgdn::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A host tensor of up to four dimensions. A strided one lives inside a larger allocation: every
// dimension one longer, dimensions 0 and 1 (and 2 and 3) swapped in memory order, the view
// starting at index 1 of each dimension.
class HostTensor {
 public:
  HostTensor(DType dtype, std::vector<int64_t> sizes, bool strided)
      : dtype_(dtype), rank_(static_cast<int>(sizes.size())) {
    std::copy(sizes.begin(), sizes.end(), sizes_);
    int64_t alloc[4] = {1, 1, 1, 1};
    int order[4] = {0, 1, 2, 3};  // memory order, outermost first
    for (int d = 0; d < rank_; ++d) alloc[d] = sizes_[d] + (strided ? 1 : 0);
    if (strided && rank_ >= 2) std::swap(order[0], order[1]);
    if (strided && rank_ == 4) std::swap(order[2], order[3]);
    int64_t stride = 1;
    for (int m = rank_ - 1; m >= 0; --m) {
      strides_[order[m]] = stride;
      stride *= alloc[order[m]];
    }
    allocated_ = stride;
    for (int d = 0; d < rank_ && strided; ++d) offset_ += strides_[d];
    storage_.resize(static_cast<size_t>(allocated_ * dtype_size(dtype) + 7) / 8);
  }

  TensorRef ref() {
    TensorRef t;
    t.data = element_base();
    t.dtype = dtype_;
    t.rank = rank_;
    std::copy(sizes_, sizes_ + 4, t.sizes);
    std::copy(strides_, strides_ + 4, t.strides);
    return t;
  }
  double get(std::initializer_list<int64_t> index) const {
    return load_scalar(storage_.data(), dtype_, offset_of(index));
  }
  void set(std::initializer_list<int64_t> index, double value) {
    store_scalar(storage_.data(), dtype_, offset_of(index), value);
  }
  void fill_allocation(double value) {
    for (int64_t e = 0; e < allocated_; ++e) store_scalar(storage_.data(), dtype_, e, value);
  }
  // Elements of the allocation outside the view that are not NaN (written out of bounds).
  int64_t non_nan_outside_view() const {
    std::vector<bool> inside(static_cast<size_t>(allocated_), false);
    for (int64_t a = 0; a < sizes_[0]; ++a)
      for (int64_t b = 0; b < sizes_[1]; ++b)
        for (int64_t c = 0; c < sizes_[2]; ++c)
          for (int64_t d = 0; d < sizes_[3]; ++d) inside[offset_of({a, b, c, d})] = true;
    int64_t count = 0;
    for (int64_t e = 0; e < allocated_; ++e)
      count += !inside[e] && !std::isnan(load_scalar(storage_.data(), dtype_, e));
    return count;
  }

 private:
  int64_t offset_of(std::initializer_list<int64_t> index) const {
    int64_t offset = offset_, d = 0;
    for (int64_t i : index) offset += i * strides_[d++];
    return offset;
  }
  void* element_base() {
    return static_cast<char*>(static_cast<void*>(storage_.data())) + offset_ * dtype_size(dtype_);
  }

  DType dtype_;
  int rank_;
  int64_t sizes_[4] = {1, 1, 1, 1};
  int64_t strides_[4] = {0, 0, 0, 0};
  int64_t offset_ = 0, allocated_ = 0;
  std::vector<double> storage_;  // 8-byte aligned bytes
};

struct ApiCase {
  int64_t batch = 1;
  int64_t seqlen = 0;            // tokens per batch entry (all packed tokens in varlen mode)
  std::vector<int64_t> lengths;  // varlen sequence lengths; empty: batch mode
  int num_qk_heads = 2, group = 1, K = 16, V = 16;
  DType dtype = DType::kF32;       // q, k, v, o
  DType beta_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  StateLayout layout = StateLayout::kKV;
  bool initial_state = true, final_state = true, in_place = false;
  bool strided = false, l2norm = false;
  std::optional<float> scale;
  GateRegime regime = GateRegime::kMixed;

  int num_v_heads() const { return num_qk_heads * group; }
  bool varlen() const { return !lengths.empty(); }
  int64_t num_seqs() const { return varlen() ? static_cast<int64_t>(lengths.size()) : batch; }
  std::string text() const {
    std::string t = "B=" + std::to_string(batch) + " T=" + std::to_string(seqlen) +
                    " Hqk=" + std::to_string(num_qk_heads) + " group=" + std::to_string(group) +
                    " K=" + std::to_string(K) + " V=" + std::to_string(V) + " dtype=" +
                    dtype_name(dtype) + " layout=" + (layout == StateLayout::kKV ? "KV" : "VK") +
                    " strided=" + std::to_string(strided) + " l2norm=" + std::to_string(l2norm) +
                    " regime=" + regime_name(regime) + " lengths:";
    for (int64_t n : lengths) (t += ' ') += std::to_string(n);
    return t;
  }
};

// Tensors of one ApiCase with fresh random contents, the problem over them, and the expected
// results from per-head token recurrences over the stored (rounded) values.
class ApiProblem {
 public:
  ApiProblem(const ApiCase& c, Rng& rng)
      : c_(c),
        q_(c.dtype, {c.batch, c.seqlen, c.num_qk_heads, c.K}, c.strided),
        k_(c.dtype, {c.batch, c.seqlen, c.num_qk_heads, c.K}, c.strided),
        v_(c.dtype, {c.batch, c.seqlen, c.num_v_heads(), c.V}, c.strided),
        o_(c.dtype, {c.batch, c.seqlen, c.num_v_heads(), c.V}, c.strided),
        g_(DType::kF32, {c.batch, c.seqlen, c.num_v_heads()}, c.strided),
        beta_(c.beta_dtype, {c.batch, c.seqlen, c.num_v_heads()}, c.strided),
        h0_(c.state_dtype, state_sizes(c), c.strided),
        ht_(c.state_dtype, state_sizes(c), c.strided) {
    fill_inputs(rng);
    problem_.in.shape = {c.batch, c.seqlen, c.num_qk_heads, c.num_v_heads(), c.K, c.V};
    if (c.varlen()) {
      cu_seqlens_.push_back(0);
      for (int64_t n : c.lengths) cu_seqlens_.push_back(cu_seqlens_.back() + n);
      problem_.in.varlen = {cu_seqlens_.data(), DType::kI64, c.num_seqs(), cu_seqlens_.data()};
    }
    problem_.in.q = q_.ref();
    problem_.in.k = k_.ref();
    problem_.in.v = v_.ref();
    problem_.in.g = g_.ref();
    problem_.in.beta = beta_.ref();
    if (c.initial_state) problem_.in.initial_state = h0_.ref();
    problem_.in.state_layout = c.layout;
    problem_.in.scale = c.scale;
    problem_.in.use_qk_l2norm_in_kernel = c.l2norm;
    problem_.o = o_.ref();
    if (c.final_state) problem_.final_state = c.in_place ? h0_.ref() : ht_.ref();
    poison_outputs();
    compute_expected();
  }

  ApiProblem(const ApiProblem&) = delete;  // problem_ points into this object's tensors
  ApiProblem& operator=(const ApiProblem&) = delete;

  // Fills the whole allocations of o and of a separate final state with NaN.
  void poison_outputs() {
    o_.fill_allocation(kNaN);
    ht_.fill_allocation(kNaN);
  }

  const ForwardProblem& problem() const { return problem_; }
  const std::vector<int64_t>& cu_seqlens() const { return cu_seqlens_; }

  // o of every (sequence, v-head) in the order of `expected_o`, read back from the output.
  std::vector<double> stored_o() const {
    std::vector<double> o;
    for_each_token([&](int64_t b, int64_t t, int h) {
      for (int j = 0; j < c_.V; ++j) o.push_back(o_.get({b, t, h, j}));
    });
    return o;
  }
  double initial_state(int64_t n, int h, int64_t i, int64_t j) const { return get_state(h0_, n, h, i, j); }
  std::vector<double> stored_final_state() const {
    std::vector<double> s;
    const HostTensor& ht = c_.in_place ? h0_ : ht_;
    for (int64_t n = 0; n < c_.num_seqs(); ++n)
      for (int h = 0; h < c_.num_v_heads(); ++h)
        for (int i = 0; i < c_.K; ++i)
          for (int j = 0; j < c_.V; ++j) s.push_back(get_state(ht, n, h, i, j));
    return s;
  }

  // Checks o and the final state against the expectation, padding zeros and out-of-view NaNs.
  void check(double o_tolerance, double state_tolerance) const {
    const std::vector<double> o = stored_o();
    ASSERT_TRUE(all_finite(o)) << "o has unwritten (NaN) or non-finite elements";
    EXPECT_LE(rel_l2(o, expected_o_), o_tolerance);
    if (c_.final_state) {
      const std::vector<double> s = stored_final_state();
      ASSERT_TRUE(all_finite(s)) << "final_state has unwritten or non-finite elements";
      EXPECT_LE(rel_l2(s, expected_state_), state_tolerance);
    }
    if (c_.varlen()) {
      for (int64_t t = cu_seqlens_.back(); t < c_.seqlen; ++t)
        for (int h = 0; h < c_.num_v_heads(); ++h)
          for (int j = 0; j < c_.V; ++j)
            ASSERT_EQ(o_.get({0, t, h, j}), 0.0) << "padding token " << t << " head " << h;
    }
    EXPECT_EQ(o_.non_nan_outside_view(), 0) << "o written outside its view";
    if (c_.final_state && !c_.in_place) {
      EXPECT_EQ(ht_.non_nan_outside_view(), 0) << "final_state written outside its view";
    }
  }

 private:
  static std::vector<int64_t> state_sizes(const ApiCase& c) {
    const int64_t rows = c.layout == StateLayout::kKV ? c.K : c.V;
    const int64_t cols = c.layout == StateLayout::kKV ? c.V : c.K;
    return {c.num_seqs(), c.num_v_heads(), rows, cols};
  }
  // Index of S[i][j] (i < K, j < V) of (sequence n, v-head h) in the case's layout.
  std::vector<int64_t> state_position(int64_t n, int h, int64_t i, int64_t j) const {
    return c_.layout == StateLayout::kKV ? std::vector<int64_t>{n, h, i, j}
                                         : std::vector<int64_t>{n, h, j, i};
  }

  // Calls fn(batch, token, v_head) for every token of every sequence, sequence-major then head.
  void for_each_token(const std::function<void(int64_t, int64_t, int)>& fn) const {
    for (int64_t n = 0; n < c_.num_seqs(); ++n) {
      const int64_t b = c_.varlen() ? 0 : n;
      const int64_t bos = c_.varlen() ? cu_seqlens_[n] : 0;
      const int64_t eos = c_.varlen() ? cu_seqlens_[n + 1] : c_.seqlen;
      for (int h = 0; h < c_.num_v_heads(); ++h)
        for (int64_t t = bos; t < eos; ++t) fn(b, t, h);
    }
  }

  void fill_inputs(Rng& rng) {
    // Raw q/k with norms far from 1 when the kernel normalises them.
    const double qk_stddev = c_.l2norm ? 3.0 : 1.0 / std::sqrt(static_cast<double>(c_.K));
    for (HostTensor* t : {&q_, &k_})
      for (int64_t b = 0; b < c_.batch; ++b)
        for (int64_t tok = 0; tok < c_.seqlen; ++tok)
          for (int h = 0; h < c_.num_qk_heads; ++h)
            for (int i = 0; i < c_.K; ++i) t->set({b, tok, h, i}, qk_stddev * rng.normal());
    for (int h = 0; h < c_.num_v_heads(); ++h) {
      GateSampler gates(c_.regime, rng);
      for (int64_t b = 0; b < c_.batch; ++b)
        for (int64_t tok = 0; tok < c_.seqlen; ++tok) {
          for (int j = 0; j < c_.V; ++j) v_.set({b, tok, h, j}, rng.normal());
          g_.set({b, tok, h}, gates.next());
          beta_.set({b, tok, h}, sigmoid(rng.normal()));
        }
    }
    for (int64_t n = 0; n < c_.num_seqs(); ++n)
      for (int h = 0; h < c_.num_v_heads(); ++h)
        for (int i = 0; i < c_.K; ++i)
          for (int j = 0; j < c_.V; ++j) set_state(h0_, n, h, i, j, rng.normal());
  }

  double get_state(const HostTensor& t, int64_t n, int h, int64_t i, int64_t j) const {
    const std::vector<int64_t> p = state_position(n, h, i, j);
    return t.get({p[0], p[1], p[2], p[3]});
  }
  void set_state(HostTensor& t, int64_t n, int h, int64_t i, int64_t j, double value) const {
    const std::vector<int64_t> p = state_position(n, h, i, j);
    t.set({p[0], p[1], p[2], p[3]}, value);
  }

  void compute_expected() {
    const double scale = c_.scale ? *c_.scale : 1.0f / std::sqrt(static_cast<float>(c_.K));
    for (int64_t n = 0; n < c_.num_seqs(); ++n) {
      const int64_t b = c_.varlen() ? 0 : n;
      const int64_t bos = c_.varlen() ? cu_seqlens_[n] : 0;
      const int64_t eos = c_.varlen() ? cu_seqlens_[n + 1] : c_.seqlen;
      for (int h = 0; h < c_.num_v_heads(); ++h) {
        reference::HeadInputs head;
        head.T = eos - bos;
        head.K = c_.K;
        head.V = c_.V;
        head.scale = scale;
        const int qk_head = h / c_.group;
        for (int64_t t = bos; t < eos; ++t) {
          for (HostTensor* src : {&q_, &k_}) {
            std::vector<double> row(c_.K);
            double sum_sq = 0.0;
            for (int i = 0; i < c_.K; ++i) {
              row[i] = src->get({b, t, qk_head, i});
              sum_sq += row[i] * row[i];
            }
            const double norm = c_.l2norm ? std::sqrt(sum_sq + 1e-6) : 1.0;
            for (double x : row) (src == &q_ ? head.q : head.k).push_back(x / norm);
          }
          for (int j = 0; j < c_.V; ++j) head.v.push_back(v_.get({b, t, h, j}));
          head.g.push_back(g_.get({b, t, h}));
          head.beta.push_back(beta_.get({b, t, h}));
        }
        for (int i = 0; i < c_.K; ++i)
          for (int j = 0; j < c_.V; ++j)
            head.s0.push_back(c_.initial_state ? get_state(h0_, n, h, i, j) : 0.0);
        const reference::HeadOutputs out = reference::recurrent_forward(head);
        expected_o_.insert(expected_o_.end(), out.o.begin(), out.o.end());
        expected_state_.insert(expected_state_.end(), out.s_final.begin(), out.s_final.end());
      }
    }
  }

  ApiCase c_;
  HostTensor q_, k_, v_, o_, g_, beta_, h0_, ht_;
  std::vector<int64_t> cu_seqlens_;
  ForwardProblem problem_;
  std::vector<double> expected_o_, expected_state_;
};

double o_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 8e-3;
    case DType::kF16: return 1e-3;
    case DType::kF64: return 1e-13;
    default: return 1e-6;
  }
}

void run_and_check(const ApiCase& c, Rng& rng) {
  SCOPED_TRACE(c.text());
  const ApiProblem p(c, rng);
  const Status status = reference::forward(p.problem());
  ASSERT_TRUE(status.ok()) << status.message();
  p.check(o_tolerance(c.dtype), c.state_dtype == DType::kF64 ? 1e-13 : 1e-6);
}

TEST(ReferenceForwardApi, BatchModeMatchesPerHeadRecurrence) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes) {
    ApiCase c;
    c.batch = 3;
    c.seqlen = 130;
    c.group = 2;
    c.K = 16;
    c.V = 24;
    c.regime = regime;
    run_and_check(c, rng);
  }
}

TEST(ReferenceForwardApi, VarlenPaddingGetsZeros) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  ApiCase c;
  c.lengths = {65, 0, 1, 64, 63, 0};
  c.seqlen = 193 + 9;  // 9 padding tokens
  c.group = 4;
  c.dtype = DType::kBF16;
  c.beta_dtype = DType::kBF16;
  c.layout = StateLayout::kVK;
  c.strided = true;
  c.l2norm = true;
  run_and_check(c, rng);
}

TEST(ReferenceForwardApi, GroupRatiosLayoutsDtypesAndStrides) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int group : {1, 2, 4})
    for (StateLayout layout : {StateLayout::kKV, StateLayout::kVK})
      for (DType dtype : {DType::kBF16, DType::kF32})
        for (bool strided : {false, true}) {
          ApiCase c;
          c.lengths = {1, 63, 65};
          c.seqlen = 129 + 3;
          c.group = group;
          c.K = 8;
          c.V = 12;
          c.dtype = dtype;
          c.layout = layout;
          c.strided = strided;
          c.l2norm = strided;
          c.regime = kAllRegimes[rng.integer(0, 3)];
          run_and_check(c, rng);
        }
}

TEST(ReferenceForwardApi, FinalStateMayAliasInitialState) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  ApiCase c;
  c.batch = 2;
  c.seqlen = 70;
  c.group = 2;
  c.dtype = DType::kF16;
  c.in_place = true;
  c.layout = StateLayout::kVK;
  c.scale = 0.3f;
  run_and_check(c, rng);
}

TEST(ReferenceForwardApi, Float64WithoutStatesAtHeadDim128) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  ApiCase c;
  c.lengths = {100, 30};
  c.seqlen = 130;
  c.num_qk_heads = 1;
  c.group = 2;
  c.K = 128;
  c.V = 128;
  c.dtype = DType::kF64;
  c.state_dtype = DType::kF64;
  c.initial_state = false;
  c.final_state = false;
  c.l2norm = true;
  c.regime = GateRegime::kStrong;
  run_and_check(c, rng);
}

// The chunked and CP forms through the public problem plumbing give the recurrence's results.
TEST(ReferenceForwardApi, ChunkedAndCpFormsMatchRecurrentForm) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  ApiCase c;
  c.lengths = {0, 1, 63, 64, 65, 200, 300};
  c.seqlen = 693 + 5;
  c.num_qk_heads = 1;
  c.group = 3;
  c.dtype = DType::kF64;
  c.state_dtype = DType::kF64;
  c.regime = GateRegime::kMixed;
  SCOPED_TRACE(c.text());
  ApiProblem p(c, rng);
  ASSERT_TRUE(reference::forward(p.problem()).ok());
  const std::vector<double> o = p.stored_o(), state = p.stored_final_state();

  using reference::ForwardForm;
  const double no_windows = -std::numeric_limits<double>::infinity();
  for (const reference::ForwardFormOptions& options :
       {reference::ForwardFormOptions{ForwardForm::kChunked},
        reference::ForwardFormOptions{ForwardForm::kContextParallel, 1, no_windows},
        reference::ForwardFormOptions{ForwardForm::kContextParallel, 2, -40.0}}) {
    SCOPED_TRACE("form " + std::to_string(static_cast<int>(options.form)) + " segment chunks " +
                 std::to_string(options.cp_segment_chunks));
    p.poison_outputs();
    ASSERT_TRUE(reference::forward_in_form(p.problem(), options).ok());
    EXPECT_LE(rel_l2(p.stored_o(), o), 1e-12);
    EXPECT_LE(rel_l2(p.stored_final_state(), state), 1e-12);
  }
}

// ShardPhase::kMaps: E (the end state from zero) and M (the transition) of every (sequence, v-head)
// make the affine map of the whole sequence: the final state from h0 is M h0 + E (an empty
// sequence: E = 0, M = I); kFinish is the plain forward.
TEST(ReferenceForwardApi, ShardMapsAreTheAffineMapOfTheSequence) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const bool varlen : {false, true}) {
    ApiCase c;
    if (varlen) {
      c.lengths = {70, 0, 1, 130};
      c.seqlen = 201 + 5;
    } else {
      c.batch = 2;
      c.seqlen = 150;
    }
    c.group = 2;
    c.K = c.V = 16;
    c.l2norm = true;
    SCOPED_TRACE(c.text());
    ApiProblem p(c, rng);
    ForwardProblem finish = p.problem();
    finish.shard_phase = ShardPhase::kFinish;
    ASSERT_TRUE(reference::forward(finish).ok());
    p.check(1e-6, 1e-6);
    const std::vector<double> final_state = p.stored_final_state();

    const int64_t N = c.num_seqs();
    const int Hv = c.num_v_heads(), K = c.K;
    HostTensor maps(DType::kF32, {2 * N, Hv, K, K}, false);
    maps.fill_allocation(kNaN);
    ForwardProblem m = p.problem();
    m.o = {};
    m.final_state = {};
    m.shard_phase = ShardPhase::kMaps;
    m.shard_maps = maps.ref();
    const Status s = reference::forward(m);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<double> affine;  // M h0 + E, in stored_final_state's order
    for (int64_t n = 0; n < N; ++n)
      for (int h = 0; h < Hv; ++h)
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < K; ++j) {
            double x = maps.get({n, h, i, j});
            for (int l = 0; l < K; ++l) x += maps.get({N + n, h, i, l}) * p.initial_state(n, h, l, j);
            affine.push_back(x);
          }
    ASSERT_TRUE(all_finite(affine)) << "shard_maps has unwritten elements";
    EXPECT_LE(rel_l2(affine, final_state), 1e-6);  // the maps are stored in fp32
    if (varlen) {  // sequence 1 is empty
      for (int h = 0; h < Hv; ++h)
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < K; ++j) {
            ASSERT_EQ(maps.get({1, h, i, j}), 0.0);
            ASSERT_EQ(maps.get({N + 1, h, i, j}), i == j ? 1.0 : 0.0);
          }
    }
  }
}

TEST(ReferenceForwardApi, RejectsInvalidArguments) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  ApiCase c;
  c.lengths = {3, 5, 2};
  c.seqlen = 12;
  c.K = 8;
  c.V = 8;
  const ApiProblem valid(c, rng);
  ASSERT_TRUE(reference::forward(valid.problem()).ok());

  struct Mutation {
    const char* argument;  // the message must start with "<argument>:"
    std::function<void(ForwardProblem&, std::vector<int64_t>&)> apply;
  };
  const Mutation mutations[] = {
      {"q", [](ForwardProblem& p, auto&) { p.in.q.data = nullptr; }},
      {"k", [](ForwardProblem& p, auto&) { p.in.k.data = nullptr; }},
      {"v", [](ForwardProblem& p, auto&) { p.in.v.data = nullptr; }},
      {"g", [](ForwardProblem& p, auto&) { p.in.g.data = nullptr; }},
      {"beta", [](ForwardProblem& p, auto&) { p.in.beta.data = nullptr; }},
      {"o", [](ForwardProblem& p, auto&) { p.o.data = nullptr; }},
      {"q", [](ForwardProblem& p, auto&) { p.in.q.dtype = DType::kI32; }},
      {"head_dim", [](ForwardProblem& p, auto&) { p.in.shape.head_dim_k = 0; }},
      {"head_dim", [](ForwardProblem& p, auto&) { p.in.shape.head_dim_v = -8; }},
      {"num_qk_heads", [](ForwardProblem& p, auto&) { p.in.shape.num_qk_heads = 0; }},
      {"num_v_heads", [](ForwardProblem& p, auto&) { p.in.shape.num_v_heads = 0; }},
      {"num_v_heads", [](ForwardProblem& p, auto&) { p.in.shape.num_v_heads = 3; }},
      {"batch", [](ForwardProblem& p, auto&) { p.in.shape.batch = 0; }},
      {"cu_seqlens", [](ForwardProblem& p, auto&) { p.in.shape.batch = 2; }},
      {"cu_seqlens", [](ForwardProblem&, auto& cu) { cu[1] = -1; }},
      {"cu_seqlens", [](ForwardProblem&, auto& cu) { std::swap(cu[1], cu[2]); }},
      {"cu_seqlens", [](ForwardProblem&, auto& cu) { cu.back() = 13; }},
      {"cu_seqlens", [](ForwardProblem&, auto& cu) { cu[0] = 1; }},
  };
  for (const Mutation& m : mutations) {
    ForwardProblem problem = valid.problem();
    std::vector<int64_t> cu = valid.cu_seqlens();
    problem.in.varlen.cu_seqlens = cu.data();
    problem.in.varlen.cu_seqlens_host = cu.data();
    m.apply(problem, cu);
    const Status status = reference::forward(problem);
    SCOPED_TRACE(std::string("argument ") + m.argument + ", message: " + status.message());
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message().rfind(std::string(m.argument) + ":", 0), 0u);
  }
}

}  // namespace
}  // namespace flashgdn::testing
