// Tests of the float64 reference backward:
//   - the token-level reverse mode against central finite differences of
//     L = Σ dO ⊙ o + Σ dS_T ⊙ S_T (the backward's own forward), for every input, every gate regime;
//   - the chunked-form backward against the token-level one (~1e-12);
//   - the public entry point (L2 norm, GVA, varlen, batch, strides, dtypes, both state layouts)
//     against finite differences and against per-head results, with NaN-poisoned outputs;
//   - invalid arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "common/host_dtype.h"
#include "flashgdn/reference.h"
#include "reference/backward.h"
#include "reference/core.h"
#include "test_util.h"

namespace flashgdn::testing {
namespace {

using reference::HeadInputs;
namespace bwd = reference::bwd;

// Fourth-order central differences, f'(x) ≈ (8(f(x+h) − f(x−h)) − (f(x+2h) − f(x−2h))) / 12h:
// truncation O(h⁴), roundoff ~ eps·|L|/h per entry. (Plain x±h differences at h = 1e-6 carry
// ~eps·|L|/h ≈ 3e-9 of roundoff per entry, more than 1e-6 of the small dg of strongly decaying
// heads.) A gradient can still sit below the roundoff floor (dh0 of a head whose first gate is
// e^-16), so the check is ‖an − fd‖ ≤ kFdTol·‖fd‖ + √n·floor with floor = 10·eps·max(1,|L|)/h.
constexpr double kFdStep = 1e-4;
constexpr double kFdTol = 1e-7;        // relative L2 error of finite differences
constexpr double kChunkedTol = 1e-11;  // relative L2 error chunked vs token-level

double central_difference(const std::function<double(double)>& loss_at, double x0,
                          double h = kFdStep) {
  const double d1 = loss_at(x0 + h) - loss_at(x0 - h);
  const double d2 = loss_at(x0 + 2 * h) - loss_at(x0 - 2 * h);
  loss_at(x0);  // leaves x restored (the returned loss is unused)
  return (8 * d1 - d2) / (12 * h);
}

// Checks analytic gradients `an` against finite differences `fd` of a loss of magnitude |L|.
void expect_fd_close(const char* name, const std::vector<double>& an, const std::vector<double>& fd,
                     double loss_value, double h = kFdStep) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < an.size(); ++i) {
    diff += (an[i] - fd[i]) * (an[i] - fd[i]);
    ref += fd[i] * fd[i];
  }
  diff = std::sqrt(diff);
  ref = std::sqrt(ref);
  const double floor = 10 * std::numeric_limits<double>::epsilon() * std::max(1.0, std::abs(loss_value)) / h;
  const double bound = kFdTol * ref + std::sqrt(static_cast<double>(an.size())) * floor;
  EXPECT_TRUE(all_finite(an)) << name;
  EXPECT_LE(diff, bound) << name << ": relative L2 error " << (ref > 0 ? diff / ref : diff)
                         << ", |fd| " << ref << ", roundoff floor per entry " << floor;
}

uint64_t announce_seed(const char* test) {
  const uint64_t seed = fresh_seed();
  std::printf("[ %s ] seed %llu (replay: FLASHGDN_TEST_SEED=%llu)\n", test,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

void normalize_rows(std::vector<double>& x, int dim) {
  for (size_t b = 0; b < x.size(); b += dim) {
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += x[b + i] * x[b + i];
    const double inv = 1.0 / std::sqrt(ss);
    for (int i = 0; i < dim; ++i) x[b + i] *= inv;
  }
}

std::vector<double> randn(Rng& rng, size_t n, double sd = 1.0) {
  std::vector<double> x(n);
  for (double& v : x) v = sd * rng.normal();
  return x;
}

// One (sequence, head) problem plus its loss weights.
struct HeadCase {
  HeadInputs h;
  std::vector<double> d_o;   // [T][V]
  std::vector<double> d_sT;  // [K][V] or empty
};

HeadCase make_head_case(Rng& rng, int64_t T, int K, int V, GateRegime regime, bool with_h0,
                        bool with_dsT) {
  HeadCase c;
  HeadInputs& h = c.h;
  h.T = T;
  h.K = K;
  h.V = V;
  h.q = randn(rng, static_cast<size_t>(T) * K);
  h.k = randn(rng, static_cast<size_t>(T) * K);
  normalize_rows(h.q, K);
  normalize_rows(h.k, K);
  h.v = randn(rng, static_cast<size_t>(T) * V);
  GateSampler gates(regime, rng);
  h.g.resize(T);
  h.beta.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    h.g[t] = gates.next();
    h.beta[t] = sigmoid(rng.normal());
  }
  h.s0 = with_h0 ? randn(rng, static_cast<size_t>(K) * V) : std::vector<double>(size_t(K) * V, 0.0);
  h.scale = 1.0 / std::sqrt(static_cast<double>(K));
  c.d_o = randn(rng, static_cast<size_t>(T) * V);
  if (with_dsT) c.d_sT = randn(rng, static_cast<size_t>(K) * V);
  return c;
}

double head_loss(const HeadCase& c) {
  const reference::HeadOutputs out = bwd::forward_tokens(c.h);
  double L = 0.0;
  for (size_t i = 0; i < out.o.size(); ++i) L += c.d_o[i] * out.o[i];
  for (size_t i = 0; i < c.d_sT.size(); ++i) L += c.d_sT[i] * out.s_final[i];
  return L;
}

// Indices to probe: all of them when few, else a random subset.
std::vector<size_t> probe_indices(Rng& rng, size_t n, size_t max_probes) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (n <= max_probes) return idx;
  std::shuffle(idx.begin(), idx.end(), rng.engine());
  idx.resize(max_probes);
  return idx;
}

// Finite differences of `loss` w.r.t. x[i] for the probed i, checked against `analytic`.
void fd_check(const char* name, std::vector<double>& x, const std::vector<double>& analytic,
              const std::vector<size_t>& probes, const std::function<double()>& loss,
              double h = kFdStep) {
  std::vector<double> fd, an;
  for (size_t i : probes) {
    fd.push_back(central_difference(
        [&](double xi) {
          x[i] = xi;
          return loss();
        },
        x[i], h));
    an.push_back(analytic[i]);
  }
  expect_fd_close(name, an, fd, loss(), h);
}

// ---------------------------------------------------------------------------------------------
// Token-level backward vs finite differences.

struct Dims {
  int64_t T;
  int K, V;
};

void check_head_fd(Rng& rng, const Dims& d, GateRegime regime, bool with_h0, bool with_dsT) {
  SCOPED_TRACE(::testing::Message() << "T=" << d.T << " K=" << d.K << " V=" << d.V
                                    << " regime=" << regime_name(regime) << " h0=" << with_h0
                                    << " dS_T=" << with_dsT);
  HeadCase c = make_head_case(rng, d.T, d.K, d.V, regime, with_h0, with_dsT);
  const bwd::HeadGrads gr = bwd::backward_tokens(c.h, c.d_o, c.d_sT);
  ASSERT_TRUE(all_finite(gr.dq) && all_finite(gr.dk) && all_finite(gr.dv) && all_finite(gr.dg) &&
              all_finite(gr.dbeta) && all_finite(gr.ds0));
  auto loss = [&] { return head_loss(c); };
  constexpr size_t kMaxProbes = 120;
  struct Item {
    const char* name;
    std::vector<double>* x;
    const std::vector<double>* grad;
  };
  std::vector<Item> items = {{"q", &c.h.q, &gr.dq},   {"k", &c.h.k, &gr.dk},
                             {"v", &c.h.v, &gr.dv},   {"g", &c.h.g, &gr.dg},
                             {"beta", &c.h.beta, &gr.dbeta}};
  if (with_h0) items.push_back({"h0", &c.h.s0, &gr.ds0});
  for (const Item& it : items)
    fd_check(it.name, *it.x, *it.grad, probe_indices(rng, it.x->size(), kMaxProbes), loss);
}

TEST(ReferenceBackward, TokenLevelMatchesFiniteDifferences) {
  Rng rng(announce_seed("ReferenceBackward.TokenLevelMatchesFiniteDifferences"));
  const Dims dims[] = {{1, 4, 4}, {63, 8, 8}, {64, 8, 4}, {65, 4, 16}, {130, 16, 8}};
  for (GateRegime regime : kAllRegimes)
    for (const Dims& d : dims) check_head_fd(rng, d, regime, /*h0=*/true, /*dS_T=*/true);
}

TEST(ReferenceBackward, TokenLevelMatchesFiniteDifferencesWithoutStateGradients) {
  Rng rng(announce_seed("ReferenceBackward.TokenLevelMatchesFiniteDifferencesWithoutStateGradients"));
  for (GateRegime regime : kAllRegimes) check_head_fd(rng, {65, 8, 8}, regime, false, false);
}

// ---------------------------------------------------------------------------------------------
// Chunked-form backward vs token-level backward.

TEST(ReferenceBackward, ChunkedMatchesTokenLevel) {
  Rng rng(announce_seed("ReferenceBackward.ChunkedMatchesTokenLevel"));
  const Dims dims[] = {{1, 8, 8},   {63, 8, 16}, {64, 16, 8},  {65, 12, 12},
                       {130, 16, 16}, {200, 8, 4}, {128, 16, 16}};
  for (GateRegime regime : kAllRegimes)
    for (const Dims& d : dims)
      for (int variant = 0; variant < 2; ++variant) {
        const bool with_state = variant == 0;
        SCOPED_TRACE(::testing::Message() << "T=" << d.T << " K=" << d.K << " V=" << d.V
                                          << " regime=" << regime_name(regime)
                                          << " h0/dS_T=" << with_state);
        const HeadCase c = make_head_case(rng, d.T, d.K, d.V, regime, with_state, with_state);
        const bwd::HeadGrads a = bwd::backward_tokens(c.h, c.d_o, c.d_sT);
        const bwd::HeadGrads b = bwd::backward_chunked(c.h, c.d_o, c.d_sT);
        EXPECT_LT(rel_l2(b.dq, a.dq), kChunkedTol) << "dq";
        EXPECT_LT(rel_l2(b.dk, a.dk), kChunkedTol) << "dk";
        EXPECT_LT(rel_l2(b.dv, a.dv), kChunkedTol) << "dv";
        // dg through the reverse cumsum is a sum of O(1) terms (E row minus column sums, the ρ/γ
        // pair) whose true total is tiny under strong decay: a chunk's early-row dg then carries
        // ~1e-15 absolute cancellation error (T = 1, g ≈ −16 gives dg ≈ 1e-7 and relative error
        // ~1e-8). Relative L2 or, failing that, an absolute bound on the scale of dk.
        double max_dg_err = 0.0, max_dk = 1.0;
        for (size_t i = 0; i < a.dg.size(); ++i) max_dg_err = std::max(max_dg_err, std::abs(b.dg[i] - a.dg[i]));
        for (double x : a.dk) max_dk = std::max(max_dk, std::abs(x));
        EXPECT_TRUE(rel_l2(b.dg, a.dg) < kChunkedTol || max_dg_err < 1e-12 * max_dk)
            << "dg: relative L2 " << rel_l2(b.dg, a.dg) << ", max abs error " << max_dg_err;
        EXPECT_LT(rel_l2(b.dbeta, a.dbeta), kChunkedTol) << "dbeta";
        EXPECT_LT(rel_l2(b.ds0, a.ds0), kChunkedTol) << "ds0";
      }
}

// ---------------------------------------------------------------------------------------------
// Public entry point. Host tensors with arbitrary strides and dtypes.

class HostTensor {
 public:
  HostTensor() = default;
  // `order`: dimensions from outermost to innermost in memory; `pad`: extra elements after each
  // dimension's span (so strides are not contiguous); `inner`: stride of the innermost dimension.
  HostTensor(DType dtype, int rank, std::vector<int64_t> extents, std::vector<int> order = {},
             int64_t pad = 0, int64_t inner = 1)
      : dtype_(dtype), rank_(rank), extents_(std::move(extents)) {
    if (order.empty()) {
      order.resize(rank);
      std::iota(order.begin(), order.end(), 0);
    }
    int64_t stride = inner;
    for (int j = rank - 1; j >= 0; --j) {
      strides_[order[j]] = stride;
      stride = stride * extents_[order[j]] + pad;
    }
    int64_t last = 0;
    for (int i = 0; i < rank; ++i) last += (extents_[i] - 1) * strides_[i];
    count_ = std::max<int64_t>(last + 1, 1);
    storage_.assign((count_ * dtype_size(dtype) + 7) / 8 + 1, 0.0);
    fill_buffer(std::numeric_limits<double>::quiet_NaN());
  }

  TensorRef ref() {
    TensorRef r;
    r.data = storage_.data();
    r.dtype = dtype_;
    r.rank = rank_;
    for (int i = 0; i < 4; ++i) {
      r.sizes[i] = i < rank_ ? extents_[i] : 0;
      r.strides[i] = i < rank_ ? strides_[i] : 0;
    }
    return r;
  }
  int64_t offset(const int64_t* idx) const {
    int64_t off = 0;
    for (int i = 0; i < rank_; ++i) off += idx[i] * strides_[i];
    return off;
  }
  double get(std::initializer_list<int64_t> idx) const {
    return load_scalar(storage_.data(), dtype_, offset(idx.begin()));
  }
  void set(std::initializer_list<int64_t> idx, double v) {
    store_scalar(storage_.data(), dtype_, offset(idx.begin()), v);
  }
  // Every element of the whole buffer (view and gaps).
  void fill_buffer(double v) {
    for (int64_t i = 0; i < count_; ++i) store_scalar(storage_.data(), dtype_, i, v);
  }
  // Visits every index of the logical view.
  void for_each(const std::function<void(const int64_t*, int64_t)>& f) const {
    int64_t idx[4] = {0, 0, 0, 0};
    int64_t total = 1;
    for (int i = 0; i < rank_; ++i) total *= extents_[i];
    for (int64_t lin = 0; lin < total; ++lin) {
      int64_t r = lin;
      for (int i = rank_ - 1; i >= 0; --i) {
        idx[i] = r % extents_[i];
        r /= extents_[i];
      }
      f(idx, offset(idx));
    }
  }
  void fill_view(const std::function<double()>& gen) {
    for_each([&](const int64_t*, int64_t off) { store_scalar(storage_.data(), dtype_, off, gen()); });
  }
  double at_offset(int64_t off) const { return load_scalar(storage_.data(), dtype_, off); }
  void set_offset(int64_t off, double v) { store_scalar(storage_.data(), dtype_, off, v); }
  // Offsets of the elements in the buffer that are NOT part of the view.
  std::vector<int64_t> gap_offsets() const {
    std::vector<char> in_view(static_cast<size_t>(count_), 0);
    for_each([&](const int64_t*, int64_t off) { in_view[off] = 1; });
    std::vector<int64_t> gaps;
    for (int64_t i = 0; i < count_; ++i)
      if (!in_view[i]) gaps.push_back(i);
    return gaps;
  }
  const std::vector<int64_t>& extents() const { return extents_; }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_ = DType::kF64;
  int rank_ = 0;
  std::vector<int64_t> extents_;
  int64_t strides_[4] = {0, 0, 0, 0};
  int64_t count_ = 0;
  std::vector<double> storage_;
};

// A whole public problem with its buffers.
struct ApiCase {
  Shape shape;
  std::vector<int64_t> cu;  // empty: batch mode
  HostTensor q, k, v, g, beta, h0, d_o, dht;
  HostTensor dq, dk, dv, dg, dbeta, dh0;
  StateLayout layout = StateLayout::kKV;
  bool l2norm = false;
  bool with_h0 = true, with_dht = true;

  int64_t num_seqs() const { return cu.empty() ? shape.batch : static_cast<int64_t>(cu.size()) - 1; }

  Inputs inputs() {
    Inputs in;
    in.shape = shape;
    if (!cu.empty()) {
      in.varlen.cu_seqlens = cu.data();
      in.varlen.dtype = DType::kI64;
      in.varlen.num_seqs = static_cast<int64_t>(cu.size()) - 1;
    }
    in.q = q.ref();
    in.k = k.ref();
    in.v = v.ref();
    in.g = g.ref();
    in.beta = beta.ref();
    if (with_h0) in.initial_state = h0.ref();
    in.state_layout = layout;
    in.use_qk_l2norm_in_kernel = l2norm;
    return in;
  }
  BackwardProblem problem() {
    BackwardProblem p;
    p.in = inputs();
    p.d_o = d_o.ref();
    if (with_dht) p.d_final_state = dht.ref();
    p.dq = dq.ref();
    p.dk = dk.ref();
    p.dv = dv.ref();
    p.dg = dg.ref();
    p.dbeta = dbeta.ref();
    if (with_h0) p.d_initial_state = dh0.ref();
    return p;
  }
};

struct ApiConfig {
  int64_t batch = 1, seqlen = 0;
  std::vector<int64_t> cu;
  int Hqk = 1, Hv = 1, K = 8, V = 8;
  DType qkv = DType::kF64, gate = DType::kF64, beta = DType::kF64, state = DType::kF64;
  StateLayout layout = StateLayout::kKV;
  bool l2norm = false, with_h0 = true, with_dht = true, strided = false;
  GateRegime regime = GateRegime::kWeak;
};

ApiCase make_api_case(Rng& rng, const ApiConfig& c) {
  ApiCase a;
  a.shape.batch = c.batch;
  a.shape.seqlen = c.seqlen;
  a.shape.num_qk_heads = c.Hqk;
  a.shape.num_v_heads = c.Hv;
  a.shape.head_dim_k = c.K;
  a.shape.head_dim_v = c.V;
  a.cu = c.cu;
  a.layout = c.layout;
  a.l2norm = c.l2norm;
  a.with_h0 = c.with_h0;
  a.with_dht = c.with_dht;
  const int64_t B = c.batch, T = c.seqlen, N = c.cu.empty() ? c.batch : int64_t(c.cu.size()) - 1;
  const int64_t srow = c.layout == StateLayout::kKV ? c.K : c.V;
  const int64_t scol = c.layout == StateLayout::kKV ? c.V : c.K;
  // Strided variant: head-first token layouts, padding between spans, non-unit inner strides.
  const std::vector<int> tok4 = c.strided ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{};
  const std::vector<int> tok3 = c.strided ? std::vector<int>{2, 0, 1} : std::vector<int>{};
  const std::vector<int> st4 = c.strided ? std::vector<int>{1, 0, 3, 2} : std::vector<int>{};
  const int64_t pad = c.strided ? 3 : 0, inner = c.strided ? 2 : 1;
  auto t4 = [&](DType dt, int H, int D) { return HostTensor(dt, 4, {B, T, H, D}, tok4, pad, inner); };
  auto t3 = [&](DType dt, int H) { return HostTensor(dt, 3, {B, T, H}, tok3, pad, inner); };
  auto st = [&](DType dt) { return HostTensor(dt, 4, {N, c.Hv, srow, scol}, st4, pad, inner); };
  a.q = t4(c.qkv, c.Hqk, c.K);
  a.k = t4(c.qkv, c.Hqk, c.K);
  a.v = t4(c.qkv, c.Hv, c.V);
  a.g = t3(c.gate, c.Hv);
  a.beta = t3(c.beta, c.Hv);
  a.h0 = st(c.state);
  a.d_o = t4(c.qkv, c.Hv, c.V);
  a.dht = st(c.state);
  a.dq = t4(c.qkv, c.Hqk, c.K);
  a.dk = t4(c.qkv, c.Hqk, c.K);
  a.dv = t4(c.qkv, c.Hv, c.V);
  a.dg = t3(c.gate, c.Hv);
  a.dbeta = t3(c.beta, c.Hv);
  a.dh0 = st(c.state);

  // q, k raw randn with per-row scale (the L2 norm inside sees varied norms); without the flag they
  // are L2-normalised here.
  for (HostTensor* x : {&a.q, &a.k}) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < c.Hqk; ++h) {
          std::vector<double> row = randn(rng, c.K, c.l2norm ? rng.uniform(0.3, 3.0) : 1.0);
          if (!c.l2norm) normalize_rows(row, c.K);
          for (int i = 0; i < c.K; ++i) x->set({b, t, h, i}, row[i]);
        }
  }
  a.v.fill_view([&] { return rng.normal(); });
  a.d_o.fill_view([&] { return rng.normal(); });
  a.beta.fill_view([&] { return sigmoid(rng.normal()); });
  for (int h = 0; h < c.Hv; ++h) {
    GateSampler gates(c.regime, rng);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) a.g.set({b, t, h}, gates.next());
  }
  a.h0.fill_view([&] { return rng.normal(); });
  a.dht.fill_view([&] { return rng.normal(); });
  return a;
}

// L = Σ dO ⊙ o + Σ dht ⊙ S_T over all sequences and v-heads, through gather_head (which applies
// the optional L2 norm) and the backward's own token forward.
double api_loss(ApiCase& a) {
  const Inputs in = a.inputs();
  const TensorRef d_o = a.d_o.ref(), dht = a.dht.ref();
  const std::vector<reference::SequenceSpan> spans = reference::sequence_spans(in);
  double L = 0.0;
  for (size_t n = 0; n < spans.size(); ++n)
    for (int h = 0; h < in.shape.num_v_heads; ++h) {
      const HeadInputs head = reference::gather_head(in, spans[n], static_cast<int64_t>(n), h);
      const reference::HeadOutputs out = bwd::forward_tokens(head);
      const std::vector<double> w = reference::gather_rows(d_o, spans[n], h, in.shape.head_dim_v);
      for (size_t i = 0; i < w.size(); ++i) L += w[i] * out.o[i];
      if (a.with_dht) {
        const std::vector<double> ws = reference::gather_state(
            dht, in.state_layout, static_cast<int64_t>(n), h, in.shape.head_dim_k, in.shape.head_dim_v);
        for (size_t i = 0; i < ws.size(); ++i) L += ws[i] * out.s_final[i];
      }
    }
  return L;
}

// Finite differences through the public entry point for every input tensor (fp64 storage).
void check_api_fd(Rng& rng, const ApiConfig& cfg, size_t max_probes) {
  ApiCase a = make_api_case(rng, cfg);
  BackwardProblem p = a.problem();
  const Status st = reference::backward(p);
  ASSERT_TRUE(st.ok()) << st.message();
  struct Item {
    const char* name;
    HostTensor* x;
    HostTensor* grad;
  };
  std::vector<Item> items = {{"q", &a.q, &a.dq}, {"k", &a.k, &a.dk}, {"v", &a.v, &a.dv},
                             {"g", &a.g, &a.dg}, {"beta", &a.beta, &a.dbeta}};
  if (cfg.with_h0) items.push_back({"h0", &a.h0, &a.dh0});
  for (const Item& it : items) {
    std::vector<int64_t> xoff, goff;
    it.x->for_each([&](const int64_t*, int64_t off) { xoff.push_back(off); });
    it.grad->for_each([&](const int64_t*, int64_t off) { goff.push_back(off); });
    ASSERT_EQ(xoff.size(), goff.size());
    std::vector<double> fd, an;
    for (size_t i : probe_indices(rng, xoff.size(), max_probes)) {
      fd.push_back(central_difference(
          [&](double xi) {
            it.x->set_offset(xoff[i], xi);
            return api_loss(a);
          },
          it.x->at_offset(xoff[i])));
      an.push_back(it.grad->at_offset(goff[i]));
    }
    expect_fd_close(it.name, an, fd, api_loss(a));
  }
}

TEST(ReferenceBackward, PublicVarlenGvaL2NormMatchesFiniteDifferences) {
  Rng rng(announce_seed("ReferenceBackward.PublicVarlenGvaL2NormMatchesFiniteDifferences"));
  for (GateRegime regime : kAllRegimes) {
    SCOPED_TRACE(regime_name(regime));
    ApiConfig c;
    c.cu = {0, 1, 1, 66, 86};  // lengths 1, 0 (empty), 65, 20; then 4 padding tokens
    c.seqlen = 90;
    c.Hqk = 2;
    c.Hv = 4;
    c.K = 8;
    c.V = 4;
    c.l2norm = true;
    c.regime = regime;
    check_api_fd(rng, c, 80);
  }
}

TEST(ReferenceBackward, PublicBatchGvaVkLayoutMatchesFiniteDifferences) {
  Rng rng(announce_seed("ReferenceBackward.PublicBatchGvaVkLayoutMatchesFiniteDifferences"));
  ApiConfig c;
  c.batch = 2;
  c.seqlen = 70;
  c.Hqk = 1;
  c.Hv = 2;
  c.K = 6;
  c.V = 5;
  c.layout = StateLayout::kVK;
  c.strided = true;
  c.regime = GateRegime::kMixed;
  check_api_fd(rng, c, 120);
  c.with_dht = false;  // no gradient into the final state
  c.l2norm = true;
  c.regime = GateRegime::kStrong;
  check_api_fd(rng, c, 80);
}

// Runs the public backward on NaN-poisoned outputs and checks: status ok, every element of every
// output view finite, padding tokens zero, gaps between view elements untouched (still NaN), and
// values equal to the per-head token-level backward within `tol` (relative L2 per tensor).
void check_api_writes(Rng& rng, const ApiConfig& cfg, double tol) {
  ApiCase a = make_api_case(rng, cfg);
  // Rounded gradients of the loss are the inputs d_o / dht of the storage dtype already.
  BackwardProblem p = a.problem();
  ASSERT_TRUE(reference::backward(p).ok());

  const Inputs in = a.inputs();
  const std::vector<reference::SequenceSpan> spans = reference::sequence_spans(in);
  const int group = cfg.Hv / cfg.Hqk;
  const int64_t valid_end = cfg.cu.empty() ? cfg.seqlen : cfg.cu.back();

  auto check_view = [&](const char* name, HostTensor& t, bool token_tensor, int rank) {
    SCOPED_TRACE(name);
    int bad = 0, nonzero_pad = 0;
    t.for_each([&](const int64_t* idx, int64_t off) {
      const double x = t.at_offset(off);
      if (!std::isfinite(x)) ++bad;
      if (token_tensor && rank >= 3 && idx[1] >= valid_end && x != 0.0) ++nonzero_pad;
    });
    EXPECT_EQ(bad, 0) << "unwritten (NaN) or non-finite elements";
    EXPECT_EQ(nonzero_pad, 0) << "padding tokens not zero";
    int touched = 0;
    for (int64_t off : t.gap_offsets())
      if (!std::isnan(t.at_offset(off))) ++touched;
    EXPECT_EQ(touched, 0) << "wrote outside the view";
  };
  check_view("dq", a.dq, true, 4);
  check_view("dk", a.dk, true, 4);
  check_view("dv", a.dv, true, 4);
  check_view("dg", a.dg, true, 3);
  check_view("dbeta", a.dbeta, true, 3);
  if (cfg.with_h0) check_view("dh0", a.dh0, false, 4);

  // Values vs the per-head token-level backward on the same (rounded) inputs.
  std::vector<double> got[6], want[6];
  const TensorRef d_o = a.d_o.ref(), dht = a.dht.ref();
  for (size_t n = 0; n < spans.size(); ++n) {
    const reference::SequenceSpan& sp = spans[n];
    const int64_t T = sp.eos - sp.bos;
    for (int hq = 0; hq < cfg.Hqk; ++hq) {
      std::vector<double> dq(size_t(T) * cfg.K, 0.0), dk(size_t(T) * cfg.K, 0.0);
      for (int hv = hq * group; hv < (hq + 1) * group; ++hv) {
        const HeadInputs head = reference::gather_head(in, sp, static_cast<int64_t>(n), hv);
        const std::vector<double> dO = reference::gather_rows(d_o, sp, hv, cfg.V);
        const std::vector<double> dsT =
            cfg.with_dht ? reference::gather_state(dht, cfg.layout, int64_t(n), hv, cfg.K, cfg.V)
                         : std::vector<double>();
        const bwd::HeadGrads gr = bwd::backward_tokens(head, dO, dsT);
        for (size_t i = 0; i < dq.size(); ++i) {
          dq[i] += gr.dq[i];
          dk[i] += gr.dk[i];
        }
        auto append = [](std::vector<double>& dst, const std::vector<double>& src) {
          dst.insert(dst.end(), src.begin(), src.end());
        };
        append(want[2], gr.dv);
        append(want[3], gr.dg);
        append(want[4], gr.dbeta);
        append(got[2], reference::gather_rows(a.dv.ref(), sp, hv, cfg.V));
        append(got[3], reference::gather_scalars(a.dg.ref(), sp, hv));
        append(got[4], reference::gather_scalars(a.dbeta.ref(), sp, hv));
        if (cfg.with_h0) {
          append(want[5], gr.ds0);
          append(got[5], reference::gather_state(a.dh0.ref(), cfg.layout, int64_t(n), hv, cfg.K, cfg.V));
        }
      }
      if (cfg.l2norm) {
        dq = bwd::l2_normalize_rows_backward(reference::gather_rows(in.q, sp, hq, cfg.K), dq, cfg.K);
        dk = bwd::l2_normalize_rows_backward(reference::gather_rows(in.k, sp, hq, cfg.K), dk, cfg.K);
      }
      want[0].insert(want[0].end(), dq.begin(), dq.end());
      want[1].insert(want[1].end(), dk.begin(), dk.end());
      const std::vector<double> gq = reference::gather_rows(a.dq.ref(), sp, hq, cfg.K);
      const std::vector<double> gk = reference::gather_rows(a.dk.ref(), sp, hq, cfg.K);
      got[0].insert(got[0].end(), gq.begin(), gq.end());
      got[1].insert(got[1].end(), gk.begin(), gk.end());
    }
  }
  const char* names[6] = {"dq", "dk", "dv", "dg", "dbeta", "dh0"};
  for (int i = 0; i < 6; ++i) {
    if (want[i].empty()) continue;
    EXPECT_LT(rel_l2(got[i], want[i]), tol) << names[i];
  }
}

TEST(ReferenceBackward, PublicWritesEveryOutputElement) {
  Rng rng(announce_seed("ReferenceBackward.PublicWritesEveryOutputElement"));
  struct Variant {
    const char* name;
    DType qkv, gate, beta, state;
    StateLayout layout;
    bool strided, l2norm;
    double tol;
  };
  // The storage rounding of the outputs: fp64 exact, fp32 ~1e-7, bf16 ~4e-3.
  const Variant variants[] = {
      {"fp64 KV contiguous", DType::kF64, DType::kF64, DType::kF64, DType::kF64, StateLayout::kKV, false, false, 1e-15},
      {"fp64 VK strided l2", DType::kF64, DType::kF64, DType::kF64, DType::kF64, StateLayout::kVK, true, true, 1e-15},
      {"bf16/fp32 KV strided", DType::kBF16, DType::kF32, DType::kBF16, DType::kF32, StateLayout::kKV, true, true, 1e-2},
      {"fp16/fp32 VK", DType::kF16, DType::kF32, DType::kF32, DType::kF32, StateLayout::kVK, false, false, 2e-3},
      {"fp32 KV strided", DType::kF32, DType::kF32, DType::kF32, DType::kF32, StateLayout::kKV, true, true, 1e-6},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    ApiConfig c;
    c.qkv = v.qkv;
    c.gate = v.gate;
    c.beta = v.beta;
    c.state = v.state;
    c.layout = v.layout;
    c.strided = v.strided;
    c.l2norm = v.l2norm;
    c.regime = GateRegime::kMixed;
    c.Hqk = 2;
    c.Hv = 6;
    c.K = 8;
    c.V = 12;
    // varlen with an empty sequence and padding
    c.cu = {0, 64, 64, 131, 132};
    c.seqlen = 140;
    check_api_writes(rng, c, v.tol);
    // batch mode, no initial state / final-state gradient
    ApiConfig b = c;
    b.cu.clear();
    b.batch = 2;
    b.seqlen = 65;
    b.with_h0 = false;
    b.with_dht = false;
    check_api_writes(rng, b, v.tol);
  }
}

TEST(ReferenceBackward, PublicStateLayoutsAgree) {
  const uint64_t seed = announce_seed("ReferenceBackward.PublicStateLayoutsAgree");
  ApiConfig c;
  c.cu = {0, 30, 100};
  c.seqlen = 100;
  c.Hqk = 1;
  c.Hv = 2;
  c.K = 4;
  c.V = 10;
  c.regime = GateRegime::kStrong;
  Rng r1(seed), r2(seed);
  c.layout = StateLayout::kKV;
  ApiCase a = make_api_case(r1, c);
  c.layout = StateLayout::kVK;
  ApiCase b = make_api_case(r2, c);  // same draws; states are stored transposed
  // Make b's state inputs the transposes of a's.
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < c.K; ++i)
        for (int64_t j = 0; j < c.V; ++j) {
          b.h0.set({n, h, j, i}, a.h0.get({n, h, i, j}));
          b.dht.set({n, h, j, i}, a.dht.get({n, h, i, j}));
        }
  BackwardProblem pa = a.problem(), pb = b.problem();
  ASSERT_TRUE(reference::backward(pa).ok());
  ASSERT_TRUE(reference::backward(pb).ok());
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < c.K; ++i)
        for (int64_t j = 0; j < c.V; ++j)
          ASSERT_EQ(b.dh0.get({n, h, j, i}), a.dh0.get({n, h, i, j}));
  a.dq.for_each([&](const int64_t* idx, int64_t off) {
    ASSERT_EQ(a.dq.at_offset(off), b.dq.get({idx[0], idx[1], idx[2], idx[3]}));
  });
  a.dg.for_each([&](const int64_t* idx, int64_t off) {
    ASSERT_EQ(a.dg.at_offset(off), b.dg.get({idx[0], idx[1], idx[2]}));
  });
}

// An empty sequence passes the final-state gradient straight to dh0.
TEST(ReferenceBackward, PublicEmptySequencePassesStateGradient) {
  Rng rng(announce_seed("ReferenceBackward.PublicEmptySequencePassesStateGradient"));
  ApiConfig c;
  c.cu = {0, 0, 5};
  c.seqlen = 5;
  c.K = 4;
  c.V = 4;
  ApiCase a = make_api_case(rng, c);
  BackwardProblem p = a.problem();
  ASSERT_TRUE(reference::backward(p).ok());
  for (int64_t i = 0; i < c.K; ++i)
    for (int64_t j = 0; j < c.V; ++j) EXPECT_EQ(a.dh0.get({0, 0, i, j}), a.dht.get({0, 0, i, j}));
}

// Shard phases in reverse: the backward's kMaps gives D (the gradient d_o alone sends into the
// entering state), the forward's kMaps gives M, and the full backward's dh0 is D + M^T dht (an
// empty sequence: D = 0, dh0 = dht). kFinish is the plain backward.
TEST(ReferenceBackward, ShardGradIsTheAffineMapInReverse) {
  Rng rng(announce_seed("ReferenceBackward.ShardGradIsTheAffineMapInReverse"));
  ApiConfig c;
  c.cu = {0, 70, 70, 71, 135};
  c.seqlen = 140;
  c.Hqk = 1;
  c.Hv = 2;
  c.l2norm = true;
  ApiCase a = make_api_case(rng, c);
  const int64_t N = 4;
  BackwardProblem full = a.problem();
  full.shard_phase = ShardPhase::kFinish;
  Status st = reference::backward(full);
  ASSERT_TRUE(st.ok()) << st.message();

  HostTensor grad(DType::kF32, 4, {N, c.Hv, c.K, c.K});
  BackwardProblem maps_bwd;
  maps_bwd.in = a.inputs();
  maps_bwd.in.initial_state = {};
  maps_bwd.d_o = a.d_o.ref();
  maps_bwd.shard_phase = ShardPhase::kMaps;
  maps_bwd.shard_grad = grad.ref();
  st = reference::backward(maps_bwd);
  ASSERT_TRUE(st.ok()) << st.message();
  HostTensor maps(DType::kF32, 4, {2 * N, c.Hv, c.K, c.K});
  ForwardProblem maps_fwd;
  maps_fwd.in = maps_bwd.in;
  maps_fwd.shard_phase = ShardPhase::kMaps;
  maps_fwd.shard_maps = maps.ref();
  st = reference::forward(maps_fwd);
  ASSERT_TRUE(st.ok()) << st.message();

  std::vector<double> affine, dh0;
  for (int64_t n = 0; n < N; ++n)
    for (int h = 0; h < c.Hv; ++h)
      for (int64_t i = 0; i < c.K; ++i)
        for (int64_t j = 0; j < c.V; ++j) {
          double x = grad.get({n, h, i, j});
          for (int64_t l = 0; l < c.K; ++l) x += maps.get({N + n, h, l, i}) * a.dht.get({n, h, l, j});
          affine.push_back(x);
          dh0.push_back(a.dh0.get({n, h, i, j}));
          if (n == 1) {
            ASSERT_EQ(grad.get({n, h, i, j}), 0.0);  // the empty sequence
          }
        }
  EXPECT_LE(rel_l2(affine, dh0), 1e-6);  // D and M are stored in fp32
}

// Reference forward (another implementation) and the backward's own forward agree.
// The kernels' bf16 roundings emulated by backward_chunked (bench/precision_study.cpp): off by
// default (bit-identical), each switch moves the gradients by bf16-level amounts, and the exact
// last-chunk dot undoes the dot's rounding where the sequence is one chunk.
TEST(ReferenceBackward, KernelRoundingEmulation) {
  Rng rng(announce_seed("ReferenceBackward.KernelRoundingEmulation"));
  for (const int64_t T : {40, 130}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const HeadCase c = make_head_case(rng, T, 16, 16, GateRegime::kWeak, true, true);
    const bwd::HeadGrads exact = bwd::backward_chunked(c.h, c.d_o, c.d_sT);
    const bwd::HeadGrads off = bwd::backward_chunked(c.h, c.d_o, c.d_sT, bwd::KernelRounding{});
    EXPECT_EQ(off.dg, exact.dg);
    EXPECT_EQ(off.dk, exact.dk);
    const bwd::HeadGrads dot = bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.dot_state = true});
    // dg's relative error has a heavy tail on one short chunk (T 40, 20000 seeds: median 9.4e-4,
    // p99.9 7.7e-3, max 1.2e-2 for the dot; "all" median 4.0e-3, p99.9 2.0e-2, max 3.6e-2), where
    // the other gradients stay under 6.3e-3: dg's bounds sit at 3x the largest seen, still far
    // below a wrong emulation's O(1).
    EXPECT_GT(rel_l2(dot.dg, exact.dg), 0.0);
    EXPECT_LT(rel_l2(dot.dg, exact.dg), 3e-2);
    EXPECT_EQ(dot.dk, exact.dk);  // the dot feeds dg only
    const bwd::HeadGrads last = bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.dot_state = true, .exact_last_dot = true});
    if (T <= reference::kChunk) {
      EXPECT_EQ(last.dg, exact.dg);
    } else {
      EXPECT_GT(rel_l2(last.dg, exact.dg), 0.0);
    }
    // dS rounded in the dot too (a gradient pass forming it from its bf16 tiles): still dg only, and
    // the exact last-chunk dot undoes both roundings where the sequence is one chunk. T 40, 20000
    // seeds: median 1.3e-3, p99.9 1.1e-2, max 1.5e-2 (the dot alone 9.2e-4, 8.0e-3, 1.2e-2 there).
    const bwd::HeadGrads dot_both =
        bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.dot_state = true, .dot_grad_state = true});
    EXPECT_NE(dot_both.dg, dot.dg);
    EXPECT_LT(rel_l2(dot_both.dg, exact.dg), 5e-2);
    EXPECT_EQ(dot_both.dk, exact.dk);
    const bwd::HeadGrads last_both = bwd::backward_chunked(
        c.h, c.d_o, c.d_sT, {.dot_state = true, .exact_last_dot = true, .dot_grad_state = true});
    if (T <= reference::kChunk) {
      EXPECT_EQ(last_both.dg, exact.dg);
    }
    const bwd::HeadGrads all = bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.operand_states = true, .tiles = true});
    for (const auto& [name, got, want] : {std::tuple{"dq", &all.dq, &exact.dq}, std::tuple{"dk", &all.dk, &exact.dk},
                                          std::tuple{"dv", &all.dv, &exact.dv}, std::tuple{"dg", &all.dg, &exact.dg}}) {
      EXPECT_GT(rel_l2(*got, *want), 1e-6) << name;
      EXPECT_LT(rel_l2(*got, *want), got == &all.dg ? 1e-1 : 5e-2) << name;
    }
    // The pre-pass's roundings reach only the states entering chunks 1, 2, ...
    const bwd::HeadGrads pre = bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.prepass_states = true});
    const bwd::HeadGrads hilo =
        bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.prepass_states = true, .prepass_exact_update = true});
    if (T <= reference::kChunk) {
      EXPECT_EQ(pre.dg, exact.dg);
      EXPECT_EQ(hilo.dk, exact.dk);
    } else {
      for (const bwd::HeadGrads* g : {&pre, &hilo}) {
        EXPECT_GT(rel_l2(g->dg, exact.dg), 0.0);
        EXPECT_GT(rel_l2(g->dk, exact.dk), 0.0);
        EXPECT_LT(rel_l2(g->dk, exact.dk), 1e-2);
      }
    }
    // A_r stored in fp16 or bf16 where the gradient pass reads it unrounded (dbeta's first term, E's
    // Ag (.) dAg, and X and Y through A_r's operand): dv never sees it; dbeta, dg and dk move by about
    // the format's rounding. 3000 seeds, worst of T 40 and 130: fp16 dbeta 2.2e-4, dg 4.0e-4, dk 1.1e-4;
    // bf16 1.8e-3, 3.3e-3, 8.5e-4. Bounds at about 3x those.
    for (const bwd::InverseStore store : {bwd::InverseStore::kFp16, bwd::InverseStore::kBf16}) {
      const double bound = store == bwd::InverseStore::kFp16 ? 1.5e-3 : 1e-2;
      SCOPED_TRACE(store == bwd::InverseStore::kFp16 ? "A_r stored in fp16" : "A_r stored in bf16");
      const bwd::HeadGrads stored = bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.inverse_store = store});
      EXPECT_EQ(stored.dv, exact.dv);
      for (const auto& [name, got, want] : {std::tuple{"dbeta", &stored.dbeta, &exact.dbeta},
                                            std::tuple{"dg", &stored.dg, &exact.dg},
                                            std::tuple{"dk", &stored.dk, &exact.dk}}) {
        EXPECT_GT(rel_l2(*got, *want), 0.0) << name;
        EXPECT_LT(rel_l2(*got, *want), bound) << name;
      }
    }
    // The dS pass's chain, as today and with the chunk's map folded first: the same recurrence up to
    // bf16 roundings (a wrong fold would miss by O(1)). It feeds dh0 and, past the last chunk (whose dS
    // is the user's), dk and dv; never dq.
    for (const bwd::DsPass mode : {bwd::DsPass::kThreeRounds, bwd::DsPass::kOneRound}) {
      SCOPED_TRACE(mode == bwd::DsPass::kOneRound ? "one round" : "three rounds");
      const bwd::HeadGrads ds = bwd::backward_chunked(c.h, c.d_o, c.d_sT, {.ds_pass = mode});
      EXPECT_EQ(ds.dq, exact.dq);
      for (const auto& [name, got, want] : {std::tuple{"dk", &ds.dk, &exact.dk}, std::tuple{"dv", &ds.dv, &exact.dv},
                                            std::tuple{"dh0", &ds.ds0, &exact.ds0}}) {
        if (T <= reference::kChunk && got != &ds.ds0) {
          EXPECT_EQ(*got, *want) << name;
          continue;
        }
        EXPECT_GT(rel_l2(*got, *want), 0.0) << name;
        EXPECT_LT(rel_l2(*got, *want), 1e-2) << name;
      }
    }
  }
}

TEST(ReferenceBackward, OwnForwardMatchesPublicForward) {
  Rng rng(announce_seed("ReferenceBackward.OwnForwardMatchesPublicForward"));
  ApiConfig c;
  c.cu = {0, 70, 71, 135};
  c.seqlen = 135;
  c.Hqk = 1;
  c.Hv = 2;
  c.l2norm = true;
  c.regime = GateRegime::kWeak;
  ApiCase a = make_api_case(rng, c);
  HostTensor o(DType::kF64, 4, {1, c.seqlen, c.Hv, c.V});
  HostTensor sT(DType::kF64, 4, {3, c.Hv, c.K, c.V});
  ForwardProblem fp;
  fp.in = a.inputs();
  fp.o = o.ref();
  fp.final_state = sT.ref();
  const Status st = reference::forward(fp);
  ASSERT_TRUE(st.ok()) << st.message();
  const std::vector<reference::SequenceSpan> spans = reference::sequence_spans(fp.in);
  for (size_t n = 0; n < spans.size(); ++n)
    for (int h = 0; h < c.Hv; ++h) {
      const reference::HeadOutputs mine =
          bwd::forward_tokens(reference::gather_head(fp.in, spans[n], int64_t(n), h));
      EXPECT_LT(rel_l2(reference::gather_rows(o.ref(), spans[n], h, c.V), mine.o), 1e-13);
      EXPECT_LT(rel_l2(reference::gather_state(sT.ref(), StateLayout::kKV, int64_t(n), h, c.K, c.V),
                       mine.s_final),
                1e-13);
    }
}

// L2-norm backward alone against finite differences.
TEST(ReferenceBackward, L2NormBackwardMatchesFiniteDifferences) {
  Rng rng(announce_seed("ReferenceBackward.L2NormBackwardMatchesFiniteDifferences"));
  const int dim = 7, rows = 5;
  std::vector<double> x = randn(rng, size_t(rows) * dim, 2.0);
  x[3 * dim + 0] = 1e-4;  // one tiny row: the eps matters
  for (int i = 1; i < dim; ++i) x[3 * dim + i] = 0.0;
  const std::vector<double> w = randn(rng, x.size());
  const std::vector<double> dx = bwd::l2_normalize_rows_backward(x, w, dim);
  auto loss = [&] {
    std::vector<double> y = x;
    reference::l2_normalize_rows(y, dim);
    double L = 0.0;
    for (size_t i = 0; i < y.size(); ++i) L += w[i] * y[i];
    return L;
  };
  std::vector<size_t> all(x.size());
  std::iota(all.begin(), all.end(), size_t{0});
  fd_check("x", x, dx, all, loss, /*h=*/1e-6);  // the tiny row's scale is ~1e-3
}

// ---------------------------------------------------------------------------------------------
// Invalid arguments.

TEST(ReferenceBackward, InvalidArguments) {
  Rng rng(announce_seed("ReferenceBackward.InvalidArguments"));
  ApiConfig c;
  c.cu = {0, 3, 7};
  c.seqlen = 8;
  c.K = 4;
  c.V = 4;
  ApiCase a = make_api_case(rng, c);
  auto expect_invalid = [](BackwardProblem p, const std::string& name) {
    const Status s = reference::backward(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.message();
    EXPECT_EQ(s.message().rfind(name + ":", 0), 0u) << "message: " << s.message();
  };
  ASSERT_TRUE(reference::backward(a.problem()).ok());
  {
    BackwardProblem p = a.problem();
    p.in.q.data = nullptr;
    expect_invalid(p, "q");
  }
  {
    BackwardProblem p = a.problem();
    p.in.g.data = nullptr;
    expect_invalid(p, "g");
  }
  {
    BackwardProblem p = a.problem();
    p.d_o.data = nullptr;
    expect_invalid(p, "do");
  }
  for (const char* out : {"dq", "dk", "dv", "dg", "dbeta"}) {
    BackwardProblem p = a.problem();
    const std::string o = out;
    (o == "dq" ? p.dq : o == "dk" ? p.dk : o == "dv" ? p.dv : o == "dg" ? p.dg : p.dbeta).data = nullptr;
    expect_invalid(p, o);
  }
  {
    BackwardProblem p = a.problem();  // initial state given, dh0 missing
    p.d_initial_state.data = nullptr;
    expect_invalid(p, "dh0");
  }
  {
    BackwardProblem p = a.problem();  // dh0 given without an initial state
    p.in.initial_state.data = nullptr;
    expect_invalid(p, "dh0");
  }
  for (const std::vector<int64_t>& cu : {std::vector<int64_t>{1, 3, 7},     // first offset not 0
                                          std::vector<int64_t>{0, 5, 3},     // decreasing
                                          std::vector<int64_t>{0, 3, 9}}) {  // past the 8 tokens
    BackwardProblem p = a.problem();
    p.in.varlen.cu_seqlens = cu.data();
    expect_invalid(p, "cu_seqlens");
  }
  {
    BackwardProblem p = a.problem();
    p.in.shape.num_v_heads = 3;
    p.in.shape.num_qk_heads = 2;
    expect_invalid(p, "num_v_heads");
  }
}

}  // namespace
}  // namespace flashgdn::testing
