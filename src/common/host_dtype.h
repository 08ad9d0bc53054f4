// Host-side scalar conversions between flashgdn's storage dtypes and double.
// Used by the reference, the validation code and the tests; no CUDA.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "flashgdn/types.h"

namespace flashgdn {

// bf16 <-> float by bit manipulation, round-to-nearest-even, NaN kept quiet.
inline float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
inline uint16_t float_to_bf16_bits(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline double load_scalar(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kF16: return static_cast<double>(static_cast<const _Float16*>(base)[offset]);
    case DType::kF32: return static_cast<const float*>(base)[offset];
    case DType::kF64: return static_cast<const double*>(base)[offset];
    case DType::kI32: return static_cast<const int32_t*>(base)[offset];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(base)[offset]);
    case DType::kU8: return static_cast<const uint8_t*>(base)[offset];
  }
  return 0.0;
}

// Rounds once from double for fp16/fp32/fp64; bf16 goes through float (double rounding can move
// an exact tie by one bf16 ulp, far below any tolerance that uses it).
inline void store_scalar(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[offset] = float_to_bf16_bits(static_cast<float>(value));
      return;
    case DType::kF16: static_cast<_Float16*>(base)[offset] = static_cast<_Float16>(value); return;
    case DType::kF32: static_cast<float*>(base)[offset] = static_cast<float>(value); return;
    case DType::kF64: static_cast<double*>(base)[offset] = value; return;
    case DType::kI32: static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(value); return;
    case DType::kI64: static_cast<int64_t*>(base)[offset] = static_cast<int64_t>(value); return;
    case DType::kU8: static_cast<uint8_t*>(base)[offset] = static_cast<uint8_t>(value); return;
  }
}

inline int64_t load_index(const void* base, DType dtype, int64_t i) {
  return dtype == DType::kI64 ? static_cast<const int64_t*>(base)[i]
                              : static_cast<int64_t>(static_cast<const int32_t*>(base)[i]);
}

}  // namespace flashgdn
