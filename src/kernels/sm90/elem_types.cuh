// Map the host-side kind tags of launch.h to device element types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/sm90/launch.h"

namespace flashgdn::kern {

template <ElemKind E>
using ElemType = std::conditional_t<E == ElemKind::kBF16, __nv_bfloat16, __half>;

template <InverseKind I>
using InverseType = std::conditional_t<I == InverseKind::kF32, float, __nv_bfloat16>;

}  // namespace flashgdn::kern
