// flashgdn public C++ API: basic types (no CUDA, no torch, no CUTLASS needed to include).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

// The CUDA runtime spells its stream handle this way; repeating the typedef lets the API be
// included by a plain C++ compiler and by code that also includes <cuda_runtime.h>.
typedef struct CUstream_st* cudaStream_t;

namespace flashgdn {

// Element types. kF64 exists for the host reference (the oracle of every test); the GPU kernels
// take bf16/fp16 q, k, v; fp32 g; fp32 or bf16 beta; fp32 states. kU8: raw bytes in the library's own
// layout (the forward's inverse cache).
enum class DType : int32_t { kBF16 = 0, kF16 = 1, kF32 = 2, kF64 = 3, kI32 = 4, kI64 = 5, kU8 = 6 };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // the caller's arguments are wrong (the message names which and why)
  kNotSupported = 2,     // valid, but a variant flashgdn does not implement (e.g. head dim 64)
  kNotBuilt = 3,         // the library was built without kernels for this GPU / variant
  kCudaError = 4,        // a CUDA runtime call failed (the message carries its error string)
  kWorkspaceTooSmall = 5,
};

// Result of every API call. No exception crosses the API.
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A strided view of up to four dimensions, like a DLPack tensor: sizes and strides in ELEMENTS
// (not bytes). A null `data` means "absent" for optional tensors. Which dimensions a field has is
// documented where the field is declared (e.g. q is (batch, token, head, dim)); validation checks
// rank and sizes against the problem's Shape and names the argument when they disagree.
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  int32_t rank = 0;
  int64_t sizes[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  bool present() const { return data != nullptr; }

  // A row-major (contiguous) view.
  static TensorRef contiguous(void* data, DType dtype, std::initializer_list<int64_t> sizes) {
    TensorRef t;
    t.data = data;
    t.dtype = dtype;
    t.rank = static_cast<int32_t>(sizes.size());
    int i = 0;
    for (int64_t s : sizes) t.sizes[i++] = s;
    int64_t stride = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.strides[d] = stride;
      stride *= t.sizes[d];
    }
    return t;
  }
  // A view with explicit strides (elements).
  static TensorRef strided(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                           std::initializer_list<int64_t> strides) {
    TensorRef t = contiguous(data, dtype, sizes);
    int i = 0;
    for (int64_t s : strides) t.strides[i++] = s;
    return t;
  }
};

// Layout of one state matrix of a (sequence, v-head): kKV stores S as [K][V] (FLA's default),
// kVK as [V][K] ("V-first", FlashInfer's and FLA's state_v_first=True).
enum class StateLayout : int32_t { kKV = 0, kVK = 1 };

}  // namespace flashgdn
