// Explicit instantiation: the backward's dS pass and gradient pass, q/k/v bf16.
#include "kernels/sm90/backward_launch.cuh"

namespace flashgdn::kern {
template cudaError_t launch_backward_ds_pass<ElemKind::kBF16>(const BackwardParams&, cudaStream_t);
template cudaError_t launch_backward_grads<ElemKind::kBF16>(const BackwardParams&, int, cudaStream_t);
}  // namespace flashgdn::kern
