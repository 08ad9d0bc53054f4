// Intra-card context parallelism (auto-CP) of the forward: the kernels around the two passes of
// the fused forward over segments (DESIGN §1; float64 reference: src/reference/cp.cpp).
//
// A sequence of C chunks is cut into ceil(C / L) segments of L chunks (the last may be shorter).
// Launch sequence (runtime/forward.cpp):
//   [segment_offsets]  varlen: first segment of each sequence
//   cp_windows         grid (segments, Hv), 64 threads (one per token of a chunk): walking the
//                      chunks of segment j backwards from its end, the summed log of a bound on each
//                      token's map norm, g_t + log max(1, |1 - beta_t |k_t|^2|) (the map
//                      e^{g}(I - beta k k^T) has norm e^{g} max(1, |1 - beta |k|^2|)), until it is
//                      <= decay_threshold: window_chunks = that many chunks; 0 when the segment never
//                      gets there (then the exact transition M_j is formed). Any keys, normalised or
//                      not, get a valid bound.
//   fused_forward      state pass: S*_j of every segment but the last from zero over its window
//                      (from h0 over the whole first segment when it has no window), and M_j
//   cp_correction      grid (N, Hv, 4 column slices of 32), 256 threads, serial over the boundaries
//                      of one sequence: S_0 = h0 (or zero; an empty sequence's final state), S_1 = S*_0
//                      and, for j >= 1,
//                        S_{j+1} = S*_j + M_j S_j   (no window)      S_{j+1} = S*_j   (window)
//                      [128,32] = [128,128] @ [128,32] in fp32 from shared memory -> segment_starts
//   fused_forward      main pass: every segment from S_j: o and the final state
// With a window, S*_j differs from the true end state by the dropped part of the entering state,
// scaled by at most e^{decay_threshold} (e^{-10} ~ 4.5e-5 of its norm by default).
#include <cuda_runtime.h>

#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {
namespace {

template <typename Elem>
__global__ void __launch_bounds__(64) cp_windows_kernel(const ForwardParams p, int32_t* windows, bool leading) {
  const int64_t x = blockIdx.x;
  const int h = blockIdx.y;
  const SegmentLocation at = locate_segment(p, x);
  if (!at.valid) return;
  int32_t* window = &windows[x * p.num_v_heads + h];
  const int hk = h / (p.num_v_heads / p.num_qk_heads);
  const int64_t b = at.seq.batch;
  const int64_t chunks = (at.eos - at.bos + kChunk - 1) / kChunk;
  __shared__ float warp_sums[2];
  float total = 0.f;  // block-uniform
  for (int64_t step = 0; step < chunks; ++step) {
    const int64_t c = leading ? step : chunks - 1 - step;
    const int64_t t = at.bos + c * kChunk + threadIdx.x;
    float term = 0.f;
    if (t < at.eos) {
      const int64_t gate_at = b * p.g_strides.batch + t * p.g_strides.token + h * p.g_strides.head;
      const int64_t beta_at = b * p.beta_strides.batch + t * p.beta_strides.token + h * p.beta_strides.head;
      const float beta = p.beta_is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[beta_at])
                                        : static_cast<const float*>(p.beta)[beta_at];
      const Elem* k = row_ptr<Elem>(p.k, p.k_strides, b, t, hk);
      float norm2 = 0.f;
      for (int vec = 0; vec < kHeadDim / 8; ++vec) {
        const uint4 raw = *reinterpret_cast<const uint4*>(k + 8 * vec);
        const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) norm2 += to_float(e[i]) * to_float(e[i]);
      }
      term = p.g[gate_at] + logf(fmaxf(1.f, fabsf(1.f - beta * norm2)));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) term += __shfl_xor_sync(0xffffffffu, term, offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = term;
    __syncthreads();
    total += warp_sums[0] + warp_sums[1];
    __syncthreads();
    if (total <= p.decay_threshold) {
      if (threadIdx.x == 0) *window = static_cast<int32_t>(step + 1);
      return;
    }
  }
  if (threadIdx.x == 0) *window = 0;
}

constexpr int kSliceCols = 32;  // state columns per correction CTA
constexpr int kPitchM = kHeadDim + 1;

struct CorrectionStorage {
  float m[kHeadDim * kPitchM];
  float s[kHeadDim * kSliceCols];
};

// One serial step of a correction: next = base + (apply_m ? M S : 0), with M = m_block or, with
// kTransposed, its transpose, and S the running [128, 32] slice in smem.s; then S := next, also
// written to `out`. Thread layout: row k = tid / 2, 16 columns from c0 = 16 * (tid % 2). Every
// thread of the block calls it with the same apply_m (the barriers inside are block-uniform).
template <bool kTransposed>
__device__ __forceinline__ void correction_step(CorrectionStorage& smem, StateBlock base, StateBlock m_block,
                                                bool apply_m, StateBlock out, int col0) {
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  float next[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) next[i] = base.load(k, col0 + c0 + i);
  if (apply_m) {
    for (int e = threadIdx.x; e < kHeadDim * kHeadDim; e += blockDim.x) {
      const int r = e / kHeadDim, c = e % kHeadDim;
      smem.m[(kTransposed ? c : r) * kPitchM + (kTransposed ? r : c)] = m_block.load(r, c);
    }
    __syncthreads();
    for (int r = 0; r < kHeadDim; ++r) {
      const float mk = smem.m[k * kPitchM + r];
#pragma unroll
      for (int i = 0; i < 16; ++i) next[i] += mk * smem.s[r * kSliceCols + c0 + i];
    }
  }
  __syncthreads();  // every thread is done reading s (and m)
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    smem.s[k * kSliceCols + c0 + i] = next[i];
    out.store(k, col0 + c0 + i, next[i]);
  }
  __syncthreads();
}

// The (sequence, v-head, column slice) of a correction CTA and its sequence's segments (the count
// clamped to the workspace: a device cu_seqlens that disagrees with the host copy must not write
// past it).
struct CorrectionSlice {
  int64_t sequence, first, count;
  int head, col0;
};
__device__ __forceinline__ CorrectionSlice correction_slice(const ForwardParams& p) {
  CorrectionSlice at;
  at.sequence = blockIdx.x;
  at.head = blockIdx.y;
  at.col0 = kSliceCols * blockIdx.z;
  at.first = first_segment(p, at.sequence);
  at.count = min(p.cu_seqlens == nullptr ? segments_per_batch_entry(p) : p.segment_offsets[at.sequence + 1] - at.first,
                 p.max_segments - at.first);
  return at;
}

__global__ void __launch_bounds__(256) cp_correction_kernel(const ForwardParams p) {
  // (forward) S_0 = h0, S_{j+1} = S*_j + [no window] M_j S_j
  extern __shared__ __align__(16) unsigned char smem_raw[];
  CorrectionStorage& smem = *reinterpret_cast<CorrectionStorage*>(smem_raw);
  const auto [n, first, count, h, col0] = correction_slice(p);
  // Thread layout of the product: row k = tid / 2, 16 columns from 16 * (tid % 2).
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  // S_0 = h0 (or zero) into the first segment's start; an empty sequence's final state is h0.
  const StateBlock h0 = sequence_initial_state(p, n, h);
  StateBlock first_start = count > 0 ? segment_state(p.segment_starts, p.num_v_heads, first, h)
                                     : sequence_final_state(p, n, h);
  if (first_start.base != nullptr) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      first_start.store(k, col0 + c0 + i, h0.base == nullptr ? 0.f : h0.load(k, col0 + c0 + i));
  }
  for (int64_t j = 1; j < count; ++j) {
    const int64_t prev = first + j - 1;
    const bool apply_m = j - 1 > 0 && p.window_chunks[prev * p.num_v_heads + h] == 0;
    correction_step<false>(smem, segment_state(p.segment_ends, p.num_v_heads, prev, h),
                           segment_state(p.segment_transitions, p.num_v_heads, prev, h), apply_m,
                           segment_state(p.segment_starts, p.num_v_heads, first + j, h), col0);
  }
}

// (backward) dS_J = dht, dS_j = dS*_j + [no window] M_j^T dS_{j+1} for j = J-1 .. 1, written as the
// gradient leaving segment j - 1: segment_grad_ends[j - 1]; an empty sequence's dh0 = dht. Same
// thread layout as the forward.
__global__ void __launch_bounds__(256) cp_grad_correction_kernel(const BackwardParams bp) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  CorrectionStorage& smem = *reinterpret_cast<CorrectionStorage*>(smem_raw);
  const ForwardParams& p = bp.fwd;
  const auto [n, first, count, h, col0] = correction_slice(p);
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  const StateBlock dht = user_state(bp.d_final_state, bp.d_final_state_strides, p.state_vk, n, h);
  if (count <= 0) {  // an empty sequence has no segment to write dh0: it is dht
    StateBlock dh0 = user_state(bp.d_initial_state, bp.d_initial_state_strides, p.state_vk, n, h);
    if (dh0.base != nullptr) {
#pragma unroll
      for (int i = 0; i < 16; ++i) dh0.store(k, col0 + c0 + i, dht.base == nullptr ? 0.f : dht.load(k, col0 + c0 + i));
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) smem.s[k * kSliceCols + c0 + i] = dht.base == nullptr ? 0.f : dht.load(k, col0 + c0 + i);
  __syncthreads();
  for (int64_t j = count - 1; j >= 1; --j) {
    const int64_t x = first + j;
    const bool apply_m = p.grad_window_chunks[x * p.num_v_heads + h] == 0 && (j < count - 1 || dht.base != nullptr);
    correction_step<true>(smem, segment_state(bp.segment_grad_starts, p.num_v_heads, x, h),
                          segment_state(p.segment_transitions, p.num_v_heads, x, h), apply_m,
                          segment_state(bp.segment_grad_ends, p.num_v_heads, x - 1, h), col0);
  }
}

}  // namespace

cudaError_t launch_cp_grad_correction(const BackwardParams& bp, cudaStream_t stream) {
  if (bp.fwd.num_seqs == 0 || bp.fwd.num_v_heads == 0) return cudaSuccess;
  constexpr int smem = sizeof(CorrectionStorage);
  if (auto err = cudaFuncSetAttribute(cp_grad_correction_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  cp_grad_correction_kernel<<<dim3(static_cast<unsigned>(bp.fwd.num_seqs), bp.fwd.num_v_heads, kHeadDim / kSliceCols),
                              256, smem, stream>>>(bp);
  return cudaGetLastError();
}

template <ElemKind E>
cudaError_t launch_cp_windows(const ForwardParams& p, int32_t* windows, bool leading, cudaStream_t stream) {
  if (p.max_segments == 0 || p.num_v_heads == 0) return cudaSuccess;
  cp_windows_kernel<ElemType<E>>
      <<<dim3(static_cast<unsigned>(p.max_segments), p.num_v_heads), 64, 0, stream>>>(p, windows, leading);
  return cudaGetLastError();
}
template cudaError_t launch_cp_windows<ElemKind::kBF16>(const ForwardParams&, int32_t*, bool, cudaStream_t);
template cudaError_t launch_cp_windows<ElemKind::kF16>(const ForwardParams&, int32_t*, bool, cudaStream_t);

cudaError_t launch_cp_correction(const ForwardParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return cudaSuccess;
  constexpr int smem = sizeof(CorrectionStorage);
  if (auto err = cudaFuncSetAttribute(cp_correction_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess)
    return err;
  cp_correction_kernel<<<dim3(static_cast<unsigned>(p.num_seqs), p.num_v_heads, kHeadDim / kSliceCols), 256, smem,
                         stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashgdn::kern
