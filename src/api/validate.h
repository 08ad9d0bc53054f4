// Internal: problem validation shared by the GPU entry points and the host reference.
#pragma once

#include "flashgdn/problem.h"
#include "flashgdn/types.h"

namespace flashgdn::detail {

// kDevice: what the SM90 kernels take (bf16/fp16 q/k/v, fp32 g, fp32/bf16 beta, fp32 states,
// K = V = 128, unit stride on the head dim, 16-byte aligned rows).
// kHost: what the float64 reference takes (any float storage, any positive head dims, any strides).
enum class Target { kDevice, kHost };

Status validate_forward(const ForwardProblem& problem, Target target);
Status validate_backward(const BackwardProblem& problem, Target target);

}  // namespace flashgdn::detail
