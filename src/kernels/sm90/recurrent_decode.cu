// Token-by-token (recurrent) forward for decoding and speculative verification: sequences of a few
// tokens (the runtime routes a call here when every sequence has at most 8 on average), where the
// chunked kernels' 64-token tiles would be mostly padding.
//
// Grid (N sequences, Hv); block 256 threads. Threads 2v and 2v+1 own rows 0-63 and 64-127 of column
// v of the state S [128 K][128 V] in 64 fp32 registers each, so every step is local to that pair
// (one shuffle per dot product) apart from broadcasting q_t and k_t:
//   S[:, v] = e^{g_t} S[:, v]
//   u       = k_t . S[:, v]                        (the old state's read-out along k_t)
//   S[:, v] += beta_t k_t (v_t[v] - u)
//   o_t[v]  = scale q_t . S[:, v]
// (q and k are the runtime's L2-normalised copies when the call asks for the norm). Initial and
// final states go through sequence_initial_state / sequence_final_state (pools, layouts, -1 slots);
// with token_states, the state after every token is kept too (speculative decoding's rollback).
// Bound by the state's HBM traffic (64 KiB read + 64 KiB written per (sequence, v-head)).
#include <cuda_runtime.h>

#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {
namespace {

constexpr int kThreads = 2 * kHeadDim;  // two per value column
constexpr int kRows = kHeadDim / 2;     // state rows per thread

template <typename Elem>
__global__ void __launch_bounds__(kThreads) recurrent_decode_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  __shared__ float q[kHeadDim], k[kHeadDim];
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const int hk = h / (p.num_v_heads / p.num_qk_heads);
  const int col = threadIdx.x / 2, row0 = kRows * (threadIdx.x % 2);
  const SequenceBounds seq = sequence_bounds(p, n);

  float state[kRows];
  const StateBlock initial = sequence_initial_state(p, n, h);
#pragma unroll
  for (int r = 0; r < kRows; ++r) state[r] = initial.base == nullptr ? 0.f : initial.load(row0 + r, col);

  for (int64_t t = seq.bos; t < seq.eos; ++t) {
    const int64_t b = seq.batch;
    if (threadIdx.x < kHeadDim) {
      q[threadIdx.x] = to_float(row_ptr<Elem>(p.q, p.q_strides, b, t, hk)[threadIdx.x]);
    } else {
      k[threadIdx.x - kHeadDim] = to_float(row_ptr<Elem>(p.k, p.k_strides, b, t, hk)[threadIdx.x - kHeadDim]);
    }
    const float v = to_float(row_ptr<Elem>(p.v, p.v_strides, b, t, h)[col]);
    const float decay = __expf(p.g[b * p.g_strides.batch + t * p.g_strides.token + h * p.g_strides.head]);
    const float beta = load_beta(p, b, t, h);
    __syncthreads();
    float u = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      state[r] *= decay;
      u += k[row0 + r] * state[r];
    }
    u += __shfl_xor_sync(0xffffffffu, u, 1);  // the other half of the column
    const float delta = beta * (v - u);
    float out = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      state[r] += k[row0 + r] * delta;
      out += q[row0 + r] * state[r];
    }
    out += __shfl_xor_sync(0xffffffffu, out, 1);
    if (p.token_states != nullptr) {  // for rolling back rejected speculative tokens
      StateBlock after = user_state(p.token_states, p.token_state_strides, p.state_vk, b * p.seqlen + t, h);
#pragma unroll
      for (int r = 0; r < kRows; ++r) after.store(row0 + r, col, state[r]);
    }
    if (p.o != nullptr && row0 == 0)
      static_cast<Elem*>(p.o)[b * p.o_strides.batch + t * p.o_strides.token + h * p.o_strides.head + col] =
          to_elem<Elem>(p.scale * out);
    __syncthreads();  // q and k are rewritten for the next token
  }

  StateBlock final = sequence_final_state(p, n, h);
  if (final.base != nullptr) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) final.store(row0 + r, col, state[r]);
  }
}

}  // namespace

template <ElemKind E>
cudaError_t launch_recurrent_decode(const ForwardParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return cudaSuccess;
  return launch_kernel(recurrent_decode_kernel<ElemType<E>>, dim3(static_cast<unsigned>(p.num_seqs), p.num_v_heads),
                       kThreads, 0, stream, p);
}
template cudaError_t launch_recurrent_decode<ElemKind::kBF16>(const ForwardParams&, cudaStream_t);
template cudaError_t launch_recurrent_decode<ElemKind::kF16>(const ForwardParams&, cudaStream_t);

}  // namespace flashgdn::kern
