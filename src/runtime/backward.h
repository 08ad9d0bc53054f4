// Internal: the backward's workspace plan without validation (for callers that build the problem
// themselves, e.g. flashgdn::distributed, and place its buffers after sizing it).
#pragma once

#include <cstddef>

#include "flashgdn/problem.h"

namespace flashgdn::detail {

// Bytes of the workspace backward(problem) needs (backward_workspace_size minus the validation).
std::size_t backward_workspace_bytes(const BackwardProblem& problem);

}  // namespace flashgdn::detail
