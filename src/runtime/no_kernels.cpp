// Entry points of a build configured with FLASHGDN_BUILD_KERNELS=OFF: validation still runs, and
// every launch answers kNotBuilt.
#include "flashgdn/flashgdn.h"

namespace flashgdn {
namespace {
Status not_built(const char* what) {
  return {StatusCode::kNotBuilt,
          std::string("flashgdn was built without CUDA kernels (FLASHGDN_BUILD_KERNELS=OFF): ") +
              what + " cannot run"};
}
}  // namespace

Status forward_workspace_size(const ForwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  return validate_forward(problem);
}
Status backward_workspace_size(const BackwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  return validate_backward(problem);
}
Status forward_cp_cache_shape(const ForwardProblem& problem, CpCacheShape* shape) {
  if (shape == nullptr) return {StatusCode::kInvalidArgument, "shape: null pointer"};
  *shape = {};
  (void)problem;  // no kernels, no CP
  return {};
}
Status forward_inverse_cache_bytes(const ForwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  (void)problem;  // no kernels, no chunk inverse
  return {};
}
Status forward(const ForwardProblem& problem, void*, std::size_t, cudaStream_t) {
  if (auto s = validate_forward(problem); !s.ok()) return s;
  return not_built("forward");
}
Status backward(const BackwardProblem& problem, void*, std::size_t, cudaStream_t) {
  if (auto s = validate_backward(problem); !s.ok()) return s;
  return not_built("backward");
}

}  // namespace flashgdn
