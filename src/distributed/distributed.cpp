// flashgdn::distributed::forward (include/flashgdn/distributed.h): the two shard phases of the
// public API around one ncclAllGather and the device scan (kernels/sm90/cp_kernels.cu).
//
// Workspace: [the phases' workspace][maps of every rank, fp32 [world, 2 N, Hv, K, K] (this rank's
//            written in place by phase 1)][entering state, fp32 [N, Hv, K, V]]
#include "flashgdn/distributed.h"

#include <string>

#include "kernels/sm90/launch.h"
#include "runtime/common.h"
#include "runtime/forward.h"

namespace flashgdn::distributed {
namespace {

Status invalid(const std::string& message) { return {StatusCode::kInvalidArgument, message}; }

Status nccl_status(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return {};
  return {StatusCode::kCudaError, std::string(what) + ": " + ncclGetErrorString(result)};
}

// A contiguous fp32 [rows, Hv, K, K] block at `data`.
TensorRef states_ref(void* data, int64_t rows, const Shape& s) {
  TensorRef t;
  t.data = data;
  t.dtype = DType::kF32;
  t.rank = 4;
  const int64_t K = s.head_dim_k;
  const int64_t sizes[4] = {rows, s.num_v_heads, K, K};
  const int64_t strides[4] = {s.num_v_heads * K * K, K * K, K, 1};
  for (int i = 0; i < 4; ++i) t.sizes[i] = sizes[i], t.strides[i] = strides[i];
  return t;
}

struct Plan {
  ForwardProblem maps, finish;  // the two phases (their buffers placed by forward())
  std::size_t phase_bytes = 0, maps_bytes = 0, all_maps = 0, entering = 0, bytes = 0;
};

Status plan(const ForwardProblem& problem, int world, Plan& out) {
  if (world < 1) return invalid("world: the communicator must have at least one rank");
  if (problem.shard_phase != ShardPhase::kNone)
    return invalid("shard_phase: the distributed forward runs both phases itself; pass kNone");
  if (problem.in.initial_state_indices.present() || problem.final_state_indices.present())
    return {StatusCode::kNotSupported, "initial_state_indices: no state pools in a sharded sequence"};
  if (problem.checkpoints.present() || problem.token_states.present())
    return {StatusCode::kNotSupported, "checkpoints: no checkpoints or token_states in a sharded sequence"};
  if (auto s = validate_forward(problem); !s.ok()) return s;
  const Shape& s = problem.in.shape;
  const int64_t N = problem.in.num_sequences();
  out.maps = problem;
  out.maps.o = {};
  out.maps.final_state = {};
  out.maps.in.initial_state = {};
  out.maps.shard_phase = ShardPhase::kMaps;
  out.maps.shard_maps = states_ref(nullptr, 2 * N, s);
  out.finish = problem;
  out.finish.final_state = {};  // the slice's own end state is not the sequence's
  out.finish.in.initial_state = states_ref(nullptr, N, s);
  out.finish.in.state_layout = StateLayout::kKV;  // the entering state is written K-major
  out.finish.shard_phase = ShardPhase::kFinish;
  // Both phases plan one layout (problem.h); each phase's call validates its problem again.
  const std::size_t block = static_cast<std::size_t>(s.num_v_heads) * s.head_dim_k * s.head_dim_k * sizeof(float);
  out.phase_bytes = detail::align_up(detail::forward_layout(out.maps, detail::kDefaultInverse).bytes);
  out.maps_bytes = 2 * static_cast<std::size_t>(N) * block;
  out.all_maps = out.phase_bytes;
  out.entering = out.all_maps + detail::align_up(static_cast<std::size_t>(world) * out.maps_bytes);
  out.bytes = out.entering + detail::align_up(static_cast<std::size_t>(N) * block);
  return {};
}

}  // namespace

Status forward_workspace_size(const ForwardProblem& problem, int world, std::size_t* bytes) {
  if (bytes == nullptr) return invalid("bytes: null pointer");
  *bytes = 0;
  Plan p;
  if (auto s = plan(problem, world, p); !s.ok()) return s;
  *bytes = p.bytes;
  return {};
}

Status forward(const ForwardProblem& problem, ncclComm_t comm, void* workspace, std::size_t workspace_bytes,
               cudaStream_t stream) {
  int world = 0, rank = 0, comm_device = -1, device = -1;
  if (auto s = nccl_status(ncclCommCount(comm, &world), "ncclCommCount"); !s.ok()) return s;
  if (auto s = nccl_status(ncclCommUserRank(comm, &rank), "ncclCommUserRank"); !s.ok()) return s;
  if (auto s = nccl_status(ncclCommCuDevice(comm, &comm_device), "ncclCommCuDevice"); !s.ok()) return s;
  if (auto s = detail::cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  if (device != comm_device)
    return invalid("comm: its device (" + std::to_string(comm_device) + ") is not the current device (" +
                   std::to_string(device) + ")");
  Plan p;
  if (auto s = plan(problem, world, p); !s.ok()) return s;
  if (auto s = detail::check_workspace(workspace, workspace_bytes, p.bytes); !s.ok()) return s;
  auto* ws = static_cast<unsigned char*>(workspace);
  float* all_maps = reinterpret_cast<float*>(ws + p.all_maps);
  float* own_maps = all_maps + static_cast<std::size_t>(rank) * (p.maps_bytes / sizeof(float));  // in place
  float* entering = reinterpret_cast<float*>(ws + p.entering);
  p.maps.shard_maps.data = own_maps;
  p.finish.in.initial_state.data = entering;

  if (auto s = flashgdn::forward(p.maps, workspace, p.phase_bytes, stream); !s.ok()) return s;
  if (auto s = nccl_status(ncclAllGather(own_maps, all_maps, p.maps_bytes / sizeof(float), ncclFloat32, comm, stream),
                           "ncclAllGather");
      !s.ok())
    return s;
  kern::ShardScanParams scan;
  scan.maps = all_maps;
  scan.world = world;
  scan.rank = rank;
  scan.num_v_heads = problem.in.shape.num_v_heads;
  scan.num_seqs = problem.in.num_sequences();
  scan.initial_state = problem.in.initial_state.data;
  scan.initial_state_bf16 = problem.in.initial_state.dtype == DType::kBF16;
  scan.entering = entering;
  scan.final_state = problem.final_state.data;
  scan.final_state_bf16 = problem.final_state.dtype == DType::kBF16;
  scan.state_vk = problem.in.state_layout == StateLayout::kVK;
  for (int i = 0; i < 4; ++i) {
    scan.initial_state_strides[i] = problem.in.initial_state.strides[i];
    scan.final_state_strides[i] = problem.final_state.strides[i];
  }
  if (auto s = detail::cuda_status(kern::launch_shard_scan(scan, stream), "shard_scan"); !s.ok()) return s;
  return flashgdn::forward(p.finish, workspace, p.phase_bytes, stream);
}

}  // namespace flashgdn::distributed
