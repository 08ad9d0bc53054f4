// The chunked form and the affine chunk map of the float64 reference (DESIGN §1) against the token
// recurrence, on fresh random inputs in every gate regime, to ~1e-12.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference_fixtures.h"

namespace flashgdn::testing {
namespace {

using reference::HeadInputs;
using reference::HeadOutputs;

constexpr double kTight = 1e-12;
constexpr int64_t kLengths[] = {1, 63, 64, 65, 130, 300};

TEST(ReferenceChunked, MatchesRecurrenceInEveryRegime) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int64_t T : kLengths)
      for (bool with_state : {false, true}) {
        const int K = static_cast<int>(rng.integer(8, 32)), V = static_cast<int>(rng.integer(8, 32));
        SCOPED_TRACE(describe(regime, T, K, V) + " initial_state=" + std::to_string(with_state));
        const HeadInputs head = random_head(rng, regime, T, K, V, with_state).in;
        const HeadOutputs naive = reference::recurrent_forward(head);
        const HeadOutputs chunked = reference::chunked_forward(head);
        ASSERT_TRUE(all_finite(chunked.o) && all_finite(chunked.s_final));
        // relative to the outputs, or to a thousandth of their terms' size where they cancel below it
        const OutputBounds bounds = output_bounds(head);
        EXPECT_LE(rel_l2_floor(chunked.o, naive.o, 1e-3 * bounds.o), kTight);
        EXPECT_LE(rel_l2_floor(chunked.s_final, naive.s_final, 1e-3 * bounds.state), kTight);
      }
}

TEST(ReferenceChunked, MatchesRecurrenceAtHeadDim128) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : {GateRegime::kZero, GateRegime::kStrong}) {
    SCOPED_TRACE(describe(regime, 130, 128, 128));
    const HeadInputs head = random_head(rng, regime, 130, 128, 128, true).in;
    const HeadOutputs naive = reference::recurrent_forward(head);
    const HeadOutputs chunked = reference::chunked_forward(head);
    EXPECT_LE(rel_l2(chunked.o, naive.o), kTight);
    EXPECT_LE(rel_l2(chunked.s_final, naive.s_final), kTight);
  }
}

// The WY form of Vd (the warp-specialized kernel's: Ag V - (Gam A_r diag(b)) K S, with Ag Gam =
// Gam A_r diag(b)) equals the chunk step's Ag (V - Gam K S), full and partial chunks.
TEST(ReferenceChunked, WyFormOfVdMatchesTheChunkStep) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int64_t T : {64, 37, 130}) {
      const int K = static_cast<int>(rng.integer(8, 32)), V = static_cast<int>(rng.integer(8, 32));
      SCOPED_TRACE(describe(regime, T, K, V));
      const HeadInputs head = random_head(rng, regime, T, K, V, true).in;
      std::vector<double> s = head.s0;
      for (int64_t c = 0; c < reference::num_chunks(T); ++c) {
        const reference::ChunkRange r = reference::chunk_range(head, c);
        const reference::ChunkStep step = reference::chunk_step(head, r, s);
        const std::vector<double> vd = reference::chunk_vd_wy(head, r, s);
        ASSERT_TRUE(all_finite(vd));
        EXPECT_LE(rel_l2(vd, step.v_new), kTight) << "chunk " << c;
        s = step.s_next;
      }
    }
}

// The pieces of one chunk step satisfy their definitions: A_r inverts the gate-free system,
// G ⊙ A_r inverts the gated one (gate extraction), Vd is the recurrence's per-token update
// u_t = b_t (v_t - e^{g_t} S_{t-1}^T k_t), and the affine map reproduces S'.
TEST(ReferenceChunked, ChunkPiecesSatisfyTheirDefinitions) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int64_t T : {64, 37}) {
      const int K = static_cast<int>(rng.integer(8, 32)), V = static_cast<int>(rng.integer(8, 32));
      SCOPED_TRACE(describe(regime, T, K, V));
      const HeadInputs head = random_head(rng, regime, T, K, V, true).in;
      const reference::ChunkRange r = reference::chunk_range(head, 0);
      ASSERT_EQ(r.n, T);
      const int n = r.n;
      const std::vector<double> g_cum = reference::chunk_gate_cumsum(head, r);
      const reference::ChunkStep step = reference::chunk_step(head, r, head.s0);

      // (I + StrictLower(diag(b) (K K^T ⊙ G_w))) (G_w ⊙ A_r) == I with G_w = 1 (gate-free) and
      // G_w = G (gated).
      for (bool gated : {false, true}) {
        auto G = [&](int s, int t) { return gated ? std::exp(g_cum[s] - g_cum[t]) : 1.0; };
        std::vector<double> system(static_cast<size_t>(n) * n, 0.0), inverse(system);
        for (int s = 0; s < n; ++s)
          for (int t = 0; t <= s; ++t) {
            double kk = 0.0;
            for (int i = 0; i < K; ++i) kk += head.k[s * K + i] * head.k[t * K + i];
            system[s * n + t] = s == t ? 1.0 : head.beta[s] * kk * G(s, t);
            inverse[s * n + t] = G(s, t) * step.a_r[s * n + t];
          }
        const std::vector<double> product = matmul(system, inverse, n, n, n);
        double worst = 0.0, a_max = 0.0;
        for (int s = 0; s < n; ++s)
          for (int t = 0; t < n; ++t) {
            worst = std::max(worst, std::abs(product[s * n + t] - (s == t ? 1.0 : 0.0)));
            a_max = std::max(a_max, std::abs(step.a_r[s * n + t]));
          }
        EXPECT_LE(worst, kTight * std::max(1.0, a_max)) << "gated=" << gated;
      }

      std::vector<double> s = head.s0, u(static_cast<size_t>(n) * V);
      for (int t = 0; t < n; ++t) {
        const double decay = std::exp(head.g[t]);
        for (double& x : s) x *= decay;
        for (int j = 0; j < V; ++j) {
          double ks = 0.0;
          for (int i = 0; i < K; ++i) ks += head.k[t * K + i] * s[i * V + j];
          u[t * V + j] = head.beta[t] * (head.v[t * V + j] - ks);
        }
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < V; ++j) s[i * V + j] += head.k[t * K + i] * u[t * V + j];
      }
      EXPECT_LE(rel_l2(step.v_new, u), kTight);
      EXPECT_LE(rel_l2(step.s_next, s), kTight);

      const reference::AffineMap map = reference::chunk_affine(head, r);
      EXPECT_LE(rel_l2(add(map.s_star, matmul(map.m, head.s0, K, K, V)), step.s_next), kTight);
    }
}

// S* + M S_start over random chunk spans equals the recurrence run over the span from S_start.
TEST(ReferenceAffine, SpanMapMatchesRecurrence) {
  const uint64_t seed = announced_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (GateRegime regime : kAllRegimes)
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t T = rng.integer(1, 400);
      const int K = static_cast<int>(rng.integer(8, 32)), V = static_cast<int>(rng.integer(8, 32));
      const HeadInputs head = random_head(rng, regime, T, K, V, true).in;
      const int64_t chunks = reference::num_chunks(T);
      int64_t c_begin = rng.integer(0, chunks), c_end = rng.integer(0, chunks);
      if (c_begin > c_end) std::swap(c_begin, c_end);
      const int64_t begin = std::min(c_begin * reference::kChunk, T);
      const int64_t end = std::min(c_end * reference::kChunk, T);
      SCOPED_TRACE(describe(regime, T, K, V) + " chunks [" + std::to_string(c_begin) + ", " +
                   std::to_string(c_end) + ")");

      const std::vector<double> s_start =
          reference::recurrent_forward(reference::slice_tokens(head, 0, begin, head.s0)).s_final;
      const std::vector<double> s_end =
          reference::recurrent_forward(reference::slice_tokens(head, begin, end, s_start)).s_final;
      const reference::AffineMap map = reference::affine_span(head, c_begin, c_end);
      EXPECT_LE(rel_l2(add(map.s_star, matmul(map.m, s_start, K, K, V)), s_end), kTight);

      const std::vector<double> s_end_from_zero =
          reference::recurrent_forward(
              reference::slice_tokens(head, begin, end, std::vector<double>(K * V, 0.0)))
              .s_final;
      if (frobenius(s_end_from_zero) > 0) {
        EXPECT_LE(rel_l2(map.s_star, s_end_from_zero), kTight);
        EXPECT_LE(rel_l2(reference::zero_start_state(head, c_begin, c_end), s_end_from_zero),
                  kTight);
      }
    }
}

}  // namespace
}  // namespace flashgdn::testing
