// Internal interface of the float64 reference BACKWARD: one (sequence, v-head) at a time.
//
// Two independent derivations of the same gradients:
//   backward_tokens  — reverse mode through the token recurrence (the oracle), with its own
//                      forward pass and a checkpointed tape (one state per kChunk tokens);
//   backward_chunked — reverse mode through the chunked form (C = kChunk), written the way the
//                      SM90 backward kernel computes it; its equations are documented in
//                      backward_chunked.cpp.
// Both take the q/k rows AFTER the optional L2 norm (HeadInputs already holds them normalised) and
// return dq/dk w.r.t. those normalised rows; the public entry (backward_api.cpp) applies the L2-norm
// backward and the grouped-value-head sum.
#pragma once

#include <vector>

#include "reference/core.h"

namespace flashgdn::reference::bwd {

// Gradients of one (sequence, v-head).
struct HeadGrads {
  std::vector<double> dq, dk;  // [T][K]  w.r.t. the (normalised) q, k rows the head read
  std::vector<double> dv;      // [T][V]
  std::vector<double> dg;      // [T]     w.r.t. the RAW per-token gate g_t
  std::vector<double> dbeta;   // [T]
  std::vector<double> ds0;     // [K][V]  w.r.t. the entering state
};

// Token recurrence forward of DESIGN §1 (the backward's own forward, also used by the tests'
// finite differences): o [T][V] and the final state [K][V].
HeadOutputs forward_tokens(const HeadInputs& h);

// Reverse mode through the token recurrence. d_o is [T][V]; d_sT is [K][V] or empty (no gradient
// flows into the final state).
HeadGrads backward_tokens(const HeadInputs& h, const std::vector<double>& d_o,
                          const std::vector<double>& d_sT);

// The SM90 backward's bf16 roundings, emulated by backward_chunked for precision studies
// (bench/precision_study.cpp); all off by default (the float64 reference):
//   dot_state       S rounded in dgamma's <dS, S> (chunk_states' S; dS stays exact there),
//                   except in the sequence's last chunk with exact_last_dot;
//   operand_states  S and dS rounded wherever they are GEMM operands (U = K S, dQ_a, dU S^T, K dS,
//                   Vd dS^T) and in the dot;
//   tiles           the bf16 tiles the gradient pass stores, bit i of tile_mask for kTileNames[i],
//                   except Vd in the sequence's last chunk with exact_last_vd (a hi + lo split there);
//   prepass_states  the pre-pass's state recurrence as v4 runs it (S fp32 between chunks): S rounded as
//                   the operand of Vd's U = K S, and rho Vd rounded as the update's operand
//                   (S' = e^gamma S + K^T (rho Vd)), unless prepass_exact_update (a hi + lo split there);
//   dot_grad_state  dS rounded in <dS, S> too (the gradient pass forming the dot from its bf16 dS^T
//                   and S^T tiles, where the dS pass forms it with dS in fp32), except in the
//                   sequence's last chunk with exact_last_dot;
//   fp32_a          dg's a term, rowsum(K (.) dK_a) = rho (.) rowsum((K dS) (.) Vd), from the fp32
//                   products (Vd before its tile's rounding), as the gradient pass takes it;
//   inverse_store   how the gradient pass reads A_r where it takes it unrounded (dbeta's first term
//                   colsum(dAg (.) G (.) A_r) and E's Ag (.) dAg = (dAg (.) G (.) 1 beta^T) (.) A_r): fp32
//                   (exact here), or stored in fp16 or bf16 by the chunk inverse (its bf16 tile then
//                   rounded from that);
//   inverse         the chunk inverse as the kernels form it (every use: the pre-pass, the dS pass and
//                   the gradient pass read one A_r), from L = diag(beta) StrictLower(K K^T) [64][64]
//                   (fp32 values, a partial chunk's rows past its end zero) to X [64][64]; null: exact
//                   (bench/chunk_inverse_emulation.h has the kernels' formats);
//   ds_pass         the dS pass's own recurrence (D = dS fp32 between chunks, every wgmma operand bf16)
//                   in place of the exact dS_prev: kThreeRounds as backward_ds_pass.cuh runs it
//                   (dVd = (rho K) D + Pg^T dO, dU = (-Ag Gamma)^T dVd, D' = e^gamma D + K^T dU + (s Gamma Q)^T dO),
//                   kOneRound with the chunk's map folded first (D' = e^gamma D + F^T D + K^T C^T + (s Gamma Q)^T dO,
//                   F^T = K^T (-Ag Gamma)^T (rho K), C^T = (-Ag Gamma)^T Pg^T dO: one D-dependent product).
enum class DsPass { kExact, kThreeRounds, kOneRound };
enum class InverseStore { kFp32, kFp16, kBf16 };
struct KernelRounding {
  bool dot_state = false, exact_last_dot = false, operand_states = false, tiles = false, exact_last_vd = false;
  unsigned tile_mask = ~0u;
  bool prepass_states = false, prepass_exact_update = false, fp32_a = false, dot_grad_state = false;
  DsPass ds_pass = DsPass::kExact;
  InverseStore inverse_store = InverseStore::kFp32;
  std::vector<double> (*inverse)(const std::vector<double>& lower) = nullptr;
};
inline constexpr const char* kTileNames[] = {"Ag", "W", "Pg", "A_r", "Vd", "dVd", "dA_r", "X", "dP", "dU", "dM"};

// Reverse mode through the chunked form (chunk length kChunk, partial last chunk allowed).
HeadGrads backward_chunked(const HeadInputs& h, const std::vector<double>& d_o,
                           const std::vector<double>& d_sT, const KernelRounding& rounding = {});

// Backward of x̂ = x / sqrt(sum(x^2) + kL2NormEps) for each row: given the raw rows x [rows][dim]
// and dx̂, returns dx = (dx̂ − x̂ (x̂·dx̂)) / sqrt(sum(x^2) + eps).
std::vector<double> l2_normalize_rows_backward(const std::vector<double>& x,
                                               const std::vector<double>& dxhat, int dim);

}  // namespace flashgdn::reference::bwd
