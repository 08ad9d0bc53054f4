// flashgdn float64 reference: the same problems as the C++ API, computed on HOST memory.
//
// Every pointer in the problem (tensors and cu_seqlens) must point to host memory. Any float
// dtype is accepted for tensors (bf16, fp16, fp32, fp64); the arithmetic is float64 throughout and
// results are rounded once into the output dtype. This is the oracle for every flashgdn test and
// the CPU path of the torch binding. It follows the token recurrence of DESIGN §1 exactly.
#pragma once

#include "flashgdn/problem.h"
#include "flashgdn/types.h"

namespace flashgdn::reference {

// o (and final_state when present).
Status forward(const ForwardProblem& problem);

// dq, dk, dv, dg, dbeta (and d_initial_state when the initial state is present).
Status backward(const BackwardProblem& problem);

}  // namespace flashgdn::reference
