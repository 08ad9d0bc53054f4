// Programmatic dependent launch (PDL) between the library's kernels on one stream.
//
// Every kernel is launched through launch_kernel, which allows programmatic stream serialization:
// the next kernel's CTAs may be scheduled while the previous kernel still runs (in its last wave,
// once each of its CTAs has called release_next_grid), so the launch and the fill of the next grid
// overlap the previous one's tail instead of following it. Correctness rests on the device side:
// the first statement of every kernel is wait_for_previous_grid() (griddepcontrol.wait), which
// returns once the previous grid of the stream has completed and its writes are visible; since
// every kernel waits before it touches global memory, the order is transitive along the stream
// (tests/cpu/kernel_sources_check.py checks that each __global__ function starts with the wait and
// that no kernel is launched with <<<>>>). Without the launch attribute the wait returns at once.
// Two exceptions, early starts: the warp-specialized forwards without CP (fused_forward_starts_early,
// fused_forward_rs.cuh) and the CP corrections outside shard mode (cp_correction_kernel,
// cp_grad_correction_kernel in cp_kernels.cu); they wait later, after loads of the call's inputs and
// of tables written two or more kernels back, which the previous kernel's own wait has ordered (the
// corrections also write S_0 there, to a block the previous kernel does not touch), and every path
// through them still waits before it ends.
// Two kernels are launched without the attribute (LaunchOrder::kAfter): the backward's gradient pass,
// whose whole calls were 2.5-4.6% slower with it than without (bench/notes.md, session 32), and the
// dS pass before it (whole calls 0.45% faster without it, the mean of three A/Bs in session 33: 9 of
// 12 rows faster); their own times are equal either way, the cause not established. Their wait then
// returns at once.
// FLASHGDN_PDL=0 in the environment launches without the attribute (A/B timing).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace flashgdn::kern {

// Blocks until the stream's previous grid has completed and its memory operations are visible.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Lets the stream's next grid launch once every CTA of this one has called it (or exited).
__device__ __forceinline__ void release_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

inline bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("FLASHGDN_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

// How a kernel's grid follows the stream's previous one: kEarly, scheduled under its tail
// (programmatic stream serialization, unless FLASHGDN_PDL=0); kAfter, once it has completed.
enum class LaunchOrder { kEarly, kAfter };

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed
// (unless FLASHGDN_PDL=0 or kOrder is kAfter); the launch's error.
template <LaunchOrder kOrder = LaunchOrder::kEarly, typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                          Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = kOrder == LaunchOrder::kEarly && programmatic_launch_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flashgdn::kern
