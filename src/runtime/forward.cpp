// Forward entry points of a build with SM90 kernels: plan the workspace, fill the kernel
// parameters from the problem, launch on the caller's stream. No allocation, no host sync.
//
// Launch sequence:
//   [l2norm_rows x2]   only with use_qk_l2norm_in_kernel: normalised q, k into the workspace
//   [chunk_offsets]    only in varlen mode: first global chunk of each sequence
//   chunk_inverse      A_r per (chunk, v-head) into the workspace
//   fused_forward      per (sequence, v-head): o and the final state
//   [zero_padding]     only in varlen mode: o of tokens past cu_seqlens[N]
#include "runtime/forward.h"

#include "api/validate.h"
#include "runtime/common.h"

namespace flashgdn {
namespace detail {

ForwardLayout forward_layout(const ForwardProblem& problem, kern::InverseKind inverse) {
  const Inputs& in = problem.in;
  const Shape& s = in.shape;
  ForwardLayout layout;
  layout.inputs = input_layout(in);
  std::size_t offset = layout.inputs.end;
  layout.inverse = offset;
  const std::size_t inverse_elem = inverse == kern::InverseKind::kF32 ? 4 : 2;
  offset = align_up(offset + static_cast<std::size_t>(s.batch * s.seqlen * s.num_v_heads) * 64 * inverse_elem);
  layout.bytes = offset;
  return layout;
}

Status forward_with(const ForwardProblem& problem, kern::InverseKind inverse, void* workspace,
                    std::size_t workspace_bytes, cudaStream_t stream) {
  if (auto s = validate_forward(problem, Target::kDevice); !s.ok()) return s;
  if (auto s = check_device(); !s.ok()) return s;
  const ForwardLayout layout = forward_layout(problem, inverse);
  if (auto s = check_workspace(workspace, workspace_bytes, layout.bytes); !s.ok()) return s;

  auto* ws = static_cast<unsigned char*>(workspace);
  kern::ForwardParams p;
  if (auto s = prepare_inputs(problem.in, layout.inputs, ws, stream, p); !s.ok()) return s;
  p.o = problem.o.data;
  p.o_strides = row_strides(problem.o);
  p.final_state = static_cast<float*>(problem.final_state.data);
  for (int i = 0; i < 4; ++i) p.final_state_strides[i] = problem.final_state.strides[i];
  p.inverse = ws + layout.inverse;

  const kern::ElemKind elem = elem_kind(problem.in);
  if (auto s = launch_inverse_and_forward(p, elem, inverse, stream); !s.ok()) return s;
  if (problem.in.varlen.present())
    return cuda_status(kern::launch_zero_padding(p, elem, stream), "zero_padding");
  return {};
}

}  // namespace detail

Status forward_workspace_size(const ForwardProblem& problem, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes: null pointer"};
  *bytes = 0;
  if (auto s = detail::validate_forward(problem, detail::Target::kDevice); !s.ok()) return s;
  *bytes = detail::forward_layout(problem, detail::kDefaultInverse).bytes;
  return {};
}

Status forward(const ForwardProblem& problem, void* workspace, std::size_t workspace_bytes,
               cudaStream_t stream) {
  return detail::forward_with(problem, detail::kDefaultInverse, workspace, workspace_bytes, stream);
}

}  // namespace flashgdn
