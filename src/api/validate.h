// Internal: problem validation shared by the GPU entry points and the host reference.
#pragma once

#include "flashgdn/problem.h"
#include "flashgdn/types.h"

namespace flashgdn::detail {

// kDevice: what the SM90 kernels take (bf16/fp16 q/k/v, fp32 g, fp32/bf16 beta, fp32 states,
// K = V = 128, unit stride on the head dim, 16-byte aligned rows).
// kHost: what the float64 reference takes (any float storage, any positive head dims, any strides).
enum class Target { kDevice, kHost };

// Calls whose sequences have at most this many tokens on average run the token-by-token decode
// kernel (runtime/forward.cpp, use_recurrent_decode); token_states exist only there.
inline constexpr int64_t kDecodeTokensPerSequence = 8;
// With a host copy of the lengths, the decode kernel also requires every sequence to be at most
// this long (a long sequence would run serially in one CTA).
inline constexpr int64_t kDecodeMaxTokens = 64;

// The inputs alone (what the forward and the backward read), as validate_forward checks them.
Status validate_inputs(const Inputs& in, Target target);
Status validate_forward(const ForwardProblem& problem, Target target);
Status validate_backward(const BackwardProblem& problem, Target target);

}  // namespace flashgdn::detail
