// Explicit instantiation: q/k/v f16, A_r stored as f32.
#include "kernels/sm90/forward_launch.cuh"

namespace flashgdn::kern {
template cudaError_t launch_chunk_inverse<ElemKind::kF16, InverseKind::kF32>(const ForwardParams&, InverseMerges, cudaStream_t);
template cudaError_t launch_fused_forward<ElemKind::kF16, InverseKind::kF32>(const ForwardParams&, cudaStream_t);
}  // namespace flashgdn::kern
