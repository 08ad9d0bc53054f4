// flashgdn inter-GPU context parallelism over NCCL, for engines without torch (torch users:
// flashgdn.distributed in Python). Built when CMake finds NCCL (target flashgdn_distributed).
//
// A batch of sequences sharded contiguously along the tokens over the ranks of an NCCL
// communicator: rank r holds its slice of every sequence (any lengths, also empty) and calls
// forward() with a ForwardProblem over its slice. Every rank makes the call, on its own device
// and stream, with the same sequence count N, heads, head dims, options and state layout, and the
// same initial_state values (the state entering rank 0's slice, or none). The call writes o of
// the slice and, where final_state is given, the state after the whole sequences (the same on
// every rank). Inside: the slice's affine map S_end = M S_start + E (ShardPhase::kMaps), one
// ncclAllGather of the maps, the scan S_{j+1} = E_j + M_j S_j on the device, and the slice's
// forward from its true entering state (ShardPhase::kFinish). No host sync, no allocation; the
// collective runs on `stream`, the communicator's device must be the current one. A rank whose
// call fails before the collective (a bad argument) leaves the others waiting in it: check the
// problem (validate_forward, forward_workspace_size) on every rank before the first call.
//
//     std::size_t bytes = 0;
//     flashgdn::distributed::forward_workspace_size(problem, world, &bytes);
//     flashgdn::distributed::forward(problem, comm, workspace, bytes, stream);
#pragma once

#include <nccl.h>

#include <cstddef>

#include "flashgdn/flashgdn.h"

namespace flashgdn::distributed {

// Workspace of forward() on a communicator of `world` ranks (validates the problem first).
Status forward_workspace_size(const ForwardProblem& problem, int world, std::size_t* bytes);

// The sharded forward described above. problem.shard_phase must be kNone; state pools,
// checkpoints and token_states are not supported (kNotSupported).
Status forward(const ForwardProblem& problem, ncclComm_t comm, void* workspace, std::size_t workspace_bytes,
               cudaStream_t stream);

// Its backward: each rank passes the BackwardProblem of its slice (its inputs as in forward(), its
// d_o, and d_final_state = the gradient of the whole sequences' final state, the same on every
// rank, or absent on every rank) and gets its slice's dq, dk, dv, dg, dbeta; d_initial_state
// (required exactly when initial_state is given, fp32) gets the initial state's gradient on rank 0
// and zeros on the others, so that its sum over the ranks is the gradient. Inside: the forward's
// maps again (one ncclAllGather) for the entering state and every rank's M, the slice's D (the
// gradient its own d_o sends into its entering state, BackwardProblem::shard_phase kMaps), one
// ncclAllGather of the D's, the reverse scan dS_out_{j-1} = M_j^T dS_out_j + D_j on the device,
// and the slice's backward from its entering state and dS_out (kFinish).
Status backward_workspace_size(const BackwardProblem& problem, int world, std::size_t* bytes);
Status backward(const BackwardProblem& problem, ncclComm_t comm, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream);

}  // namespace flashgdn::distributed
