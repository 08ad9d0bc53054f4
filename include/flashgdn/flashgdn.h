// flashgdn public C++ API: entry points. Include this one header.
//
// Every call takes raw device pointers (described by ForwardProblem / BackwardProblem), a
// caller-provided workspace of the size the matching *_workspace_size query returns, and a CUDA
// stream. No call allocates device memory, synchronises the host with the device, or keeps
// global state; errors come back as a Status naming the bad argument.
//
// Typical use:
//     flashgdn::ForwardProblem p = ...;
//     std::size_t bytes = 0;
//     if (auto s = flashgdn::forward_workspace_size(p, &bytes); !s.ok()) { ... }
//     void* ws = my_allocator(bytes);
//     if (auto s = flashgdn::forward(p, ws, bytes, stream); !s.ok()) { ... }
#pragma once

#include <cstddef>

#include "flashgdn/problem.h"
#include "flashgdn/types.h"

namespace flashgdn {

// Checks shapes, dtypes, strides, alignment, aliasing and (when a host copy is given) the
// cu_seqlens offsets of a problem for the GPU kernels. Reads no device memory.
Status validate_forward(const ForwardProblem& problem);
Status validate_backward(const BackwardProblem& problem);

// Device workspace (bytes) a call needs; 0 is a valid answer. Validates first.
Status forward_workspace_size(const ForwardProblem& problem, std::size_t* bytes);
Status backward_workspace_size(const BackwardProblem& problem, std::size_t* bytes);

// The intra-card CP cut a forward call runs (ForwardProblem::cp_states' size): segment_chunks = 0
// where it runs none (then cp_states must be absent), else the segment length in 64-token chunks and
// `segments` the rows cp_states needs (exact with host lengths, else a bound). Host-only: no device
// access, no sync. Validates the inputs first (the outputs may be absent).
struct CpCacheShape {
  int64_t segment_chunks = 0;
  int64_t segments = 0;
};
Status forward_cp_cache_shape(const ForwardProblem& problem, CpCacheShape* shape);

// The bytes of a forward call's inverse cache (ForwardProblem::inverse_cache, for the backward): 0 where
// the call runs no chunk inverse the backward can take (decode-sized calls, shard phases; then
// inverse_cache must be absent). Host-only: no device access, no sync. Validates
// the inputs first (the outputs may be absent).
Status forward_inverse_cache_bytes(const ForwardProblem& problem, std::size_t* bytes);

// Enqueue the computation on `stream`. Returns kNotBuilt when this build has no kernel for the
// problem's variant or for the current device, never a silent no-op.
Status forward(const ForwardProblem& problem, void* workspace, std::size_t workspace_bytes,
               cudaStream_t stream);
Status backward(const BackwardProblem& problem, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream);

// Library version, e.g. "0.1.0".
const char* version();

}  // namespace flashgdn
