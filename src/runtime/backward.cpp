// Backward entry points of a build with SM90 kernels. The backward kernels do not exist yet: the
// calls validate their arguments and then answer kNotBuilt (never a silent no-op).
#include "api/validate.h"
#include "flashgdn/flashgdn.h"

namespace flashgdn {

Status backward_workspace_size(const BackwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  return detail::validate_backward(problem, detail::Target::kDevice);
}

Status backward(const BackwardProblem& problem, void*, std::size_t, cudaStream_t) {
  if (auto s = detail::validate_backward(problem, detail::Target::kDevice); !s.ok()) return s;
  return {StatusCode::kNotBuilt, "backward: the SM90 backward kernels are not built yet in this version"};
}

}  // namespace flashgdn
