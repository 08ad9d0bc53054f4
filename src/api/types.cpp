#include <cmath>

#include "flashgdn/flashgdn.h"

namespace flashgdn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

float Inputs::effective_scale() const {
  return scale.has_value() ? *scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim_k));
}

const char* version() { return FLASHGDN_VERSION; }

}  // namespace flashgdn
