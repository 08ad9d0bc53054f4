// flashgdn::distributed::forward and backward (include/flashgdn/distributed.h): the shard phases
// of the public API around ncclAllGather and the device scans (kernels/sm90/cp_kernels.cu).
//
// Forward workspace: [the phases' workspace][maps of every rank, fp32 [world, 2 N, Hv, K, K] (this
//                    rank's written in place by phase 1)][entering state, fp32 [N, Hv, K, V]]
// Backward workspace: see BackwardPlan.
#include "flashgdn/distributed.h"

#include <string>

#include "kernels/sm90/launch.h"
#include "runtime/backward.h"
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

// The rank and size of comm, checked against the current device.
Status comm_rank(ncclComm_t comm, int& world, int& rank) {
  int comm_device = -1, device = -1;
  if (auto s = nccl_status(ncclCommCount(comm, &world), "ncclCommCount"); !s.ok()) return s;
  if (auto s = nccl_status(ncclCommUserRank(comm, &rank), "ncclCommUserRank"); !s.ok()) return s;
  if (auto s = nccl_status(ncclCommCuDevice(comm, &comm_device), "ncclCommCuDevice"); !s.ok()) return s;
  if (auto s = detail::cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  if (device != comm_device)
    return invalid("comm: its device (" + std::to_string(comm_device) + ") is not the current device (" +
                   std::to_string(device) + ")");
  return {};
}

// The backward's plan: the forward's maps phase (for S_rank and every M_j), then the backward's
// two phases; one phase region serves the forward's phase and then the backward's.
// Workspace: [phase region][maps, fp32 [world, 2 N, Hv, K, K]][entering, fp32 [N, Hv, K, V]]
//            [D of every rank, fp32 [world, N, Hv, K, V]][dS_out, fp32 [N, Hv, K, V]][dh0, same]
struct BackwardPlan {
  Plan fwd;
  BackwardProblem maps, finish;
  std::size_t phase_bytes = 0, grad_bytes = 0, all_grads = 0, d_out = 0, dh0 = 0, bytes = 0;
};

Status plan_backward(const BackwardProblem& problem, int world, BackwardPlan& out) {
  if (problem.shard_phase != ShardPhase::kNone)
    return invalid("shard_phase: the distributed backward runs both phases itself; pass kNone");
  if (auto s = validate_backward(problem); !s.ok()) return s;
  ForwardProblem forward_problem;
  forward_problem.in = problem.in;
  forward_problem.o = problem.dv;  // a [B, T, Hv, V] tensor of v's dtype for the plan's checks only
  if (auto s = plan(forward_problem, world, out.fwd); !s.ok()) return s;
  const Shape& s = problem.in.shape;
  const int64_t N = problem.in.num_sequences();
  out.maps = problem;
  out.maps.in.initial_state = {};
  out.maps.d_final_state = out.maps.dq = out.maps.dk = out.maps.dv = out.maps.dg = out.maps.dbeta = {};
  out.maps.d_initial_state = {};
  out.maps.shard_phase = ShardPhase::kMaps;
  out.maps.shard_grad = states_ref(nullptr, N, s);
  out.finish = problem;
  out.finish.in.initial_state = states_ref(nullptr, N, s);  // entering, K-major
  out.finish.in.state_layout = StateLayout::kKV;
  out.finish.d_final_state = states_ref(nullptr, N, s);     // dS_out
  out.finish.d_initial_state = states_ref(nullptr, N, s);   // dh0, stored in the user's layout afterwards
  out.finish.shard_phase = ShardPhase::kFinish;
  const std::size_t bwd_bytes = detail::backward_workspace_bytes(out.maps);
  const std::size_t block = static_cast<std::size_t>(s.num_v_heads) * s.head_dim_k * s.head_dim_k * sizeof(float);
  out.phase_bytes = detail::align_up(bwd_bytes > out.fwd.phase_bytes ? bwd_bytes : out.fwd.phase_bytes);
  out.grad_bytes = static_cast<std::size_t>(N) * block;
  // The forward plan's maps and entering follow the phase region: shift them past the larger one.
  const std::size_t shift = out.phase_bytes - out.fwd.phase_bytes;
  out.fwd.all_maps += shift;
  out.fwd.entering += shift;
  out.fwd.bytes += shift;
  out.all_grads = out.fwd.bytes;
  out.d_out = out.all_grads + detail::align_up(static_cast<std::size_t>(world) * out.grad_bytes);
  out.dh0 = out.d_out + detail::align_up(out.grad_bytes);
  out.bytes = out.dh0 + detail::align_up(out.grad_bytes);
  return {};
}

// Phase 1 of the forward, the all-gather of the maps and the scan (S_rank into entering; the
// whole sequences' final state into final_state when given).
Status forward_maps_and_scan(Plan& p, const Inputs& in, const TensorRef& final_state, ncclComm_t comm, int world,
                             int rank, unsigned char* ws, std::size_t phase_bytes, cudaStream_t stream) {
  float* all_maps = reinterpret_cast<float*>(ws + p.all_maps);
  float* entering = reinterpret_cast<float*>(ws + p.entering);
  p.maps.shard_maps.data = all_maps + static_cast<std::size_t>(rank) * (p.maps_bytes / sizeof(float));  // in place
  if (auto s = flashgdn::forward(p.maps, ws, phase_bytes, stream); !s.ok()) return s;
  if (auto s = nccl_status(ncclAllGather(p.maps.shard_maps.data, all_maps, p.maps_bytes / sizeof(float), ncclFloat32,
                                         comm, stream),
                           "ncclAllGather (maps)");
      !s.ok())
    return s;
  kern::ShardScanParams scan;
  scan.maps = all_maps;
  scan.world = world;
  scan.rank = rank;
  scan.num_v_heads = in.shape.num_v_heads;
  scan.num_seqs = in.num_sequences();
  scan.initial_state = in.initial_state.data;
  scan.initial_state_bf16 = in.initial_state.dtype == DType::kBF16;
  scan.entering = entering;
  scan.final_state = final_state.data;
  scan.final_state_bf16 = final_state.dtype == DType::kBF16;
  scan.state_vk = in.state_layout == StateLayout::kVK;
  for (int i = 0; i < 4; ++i) {
    scan.initial_state_strides[i] = in.initial_state.strides[i];
    scan.final_state_strides[i] = final_state.strides[i];
  }
  return detail::cuda_status(kern::launch_shard_scan(scan, stream), "shard_scan");
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
  int world = 0, rank = 0;
  if (auto s = comm_rank(comm, world, rank); !s.ok()) return s;
  Plan p;
  if (auto s = plan(problem, world, p); !s.ok()) return s;
  if (auto s = detail::check_workspace(workspace, workspace_bytes, p.bytes); !s.ok()) return s;
  auto* ws = static_cast<unsigned char*>(workspace);
  if (auto s = forward_maps_and_scan(p, problem.in, problem.final_state, comm, world, rank, ws, p.phase_bytes, stream);
      !s.ok())
    return s;
  p.finish.in.initial_state.data = ws + p.entering;
  return flashgdn::forward(p.finish, workspace, p.phase_bytes, stream);
}

Status backward_workspace_size(const BackwardProblem& problem, int world, std::size_t* bytes) {
  if (bytes == nullptr) return invalid("bytes: null pointer");
  *bytes = 0;
  BackwardPlan p;
  if (auto s = plan_backward(problem, world, p); !s.ok()) return s;
  *bytes = p.bytes;
  return {};
}

Status backward(const BackwardProblem& problem, ncclComm_t comm, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream) {
  int world = 0, rank = 0;
  if (auto s = comm_rank(comm, world, rank); !s.ok()) return s;
  BackwardPlan p;
  if (auto s = plan_backward(problem, world, p); !s.ok()) return s;
  if (auto s = detail::check_workspace(workspace, workspace_bytes, p.bytes); !s.ok()) return s;
  auto* ws = static_cast<unsigned char*>(workspace);
  // S_rank and every M_j (the forward's maps; the forward's final state is not needed here)
  if (auto s = forward_maps_and_scan(p.fwd, problem.in, {}, comm, world, rank, ws, p.phase_bytes, stream); !s.ok())
    return s;
  // D_rank, gathered in place
  float* all_grads = reinterpret_cast<float*>(ws + p.all_grads);
  const std::size_t grad_floats = p.grad_bytes / sizeof(float);
  p.maps.shard_grad.data = all_grads + static_cast<std::size_t>(rank) * grad_floats;
  if (auto s = flashgdn::backward(p.maps, workspace, p.phase_bytes, stream); !s.ok()) return s;
  if (auto s = nccl_status(ncclAllGather(p.maps.shard_grad.data, all_grads, grad_floats, ncclFloat32, comm, stream),
                           "ncclAllGather (state gradients)");
      !s.ok())
    return s;
  // dS_out of this slice
  kern::ShardGradScanParams scan;
  scan.maps = reinterpret_cast<const float*>(ws + p.fwd.all_maps);
  scan.reaching = all_grads;
  scan.world = world;
  scan.rank = rank;
  scan.num_v_heads = problem.in.shape.num_v_heads;
  scan.num_seqs = problem.in.num_sequences();
  scan.d_final_state = static_cast<const float*>(problem.d_final_state.data);
  for (int i = 0; i < 4; ++i) scan.d_final_state_strides[i] = problem.d_final_state.strides[i];
  scan.state_vk = problem.in.state_layout == StateLayout::kVK;
  scan.d_out = reinterpret_cast<float*>(ws + p.d_out);
  if (auto s = detail::cuda_status(kern::launch_shard_grad_scan(scan, stream), "shard_grad_scan"); !s.ok()) return s;
  // The slice's backward from S_rank and dS_out, then the initial state's gradient in the user's layout
  p.finish.in.initial_state.data = ws + p.fwd.entering;
  p.finish.d_final_state.data = ws + p.d_out;
  p.finish.d_initial_state.data = ws + p.dh0;
  if (auto s = flashgdn::backward(p.finish, workspace, p.phase_bytes, stream); !s.ok()) return s;
  if (!problem.d_initial_state.present()) return {};
  return detail::cuda_status(
      kern::launch_state_store(rank == 0 ? reinterpret_cast<const float*>(ws + p.dh0) : nullptr,
                               static_cast<float*>(problem.d_initial_state.data), problem.d_initial_state.strides,
                               problem.in.state_layout == StateLayout::kVK, problem.in.num_sequences(),
                               problem.in.shape.num_v_heads, stream),
      "state_store (dh0)");
}

}  // namespace flashgdn::distributed
