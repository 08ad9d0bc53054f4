// Token-by-token (recurrent) forward for decoding and speculative verification: sequences of a few
// tokens (the runtime routes a call here when every sequence has at most 8 on average), where the
// chunked kernels' 64-token tiles would be mostly padding.
//
// Grid (N sequences, Hv, 4 column blocks); block 128 threads = 4 warps. The CTA owns the 32 value
// columns 32 z .. 32 z + 31 of one state S [128 K][128 V]; lane l holds column 32 z + l, warp w its
// rows 32 w .. 32 w + 31, in 32 fp32 registers. In the [K][V] layout a warp's load or store of one
// row is 128 contiguous bytes; in the V-first layout a thread's 32 rows are contiguous (16-byte
// vectors). Small CTAs (96 registers a thread, 0 spills: five CTAs a SM; at 80 or fewer the state
// spills) let several share a SM, so that one CTA's state traffic overlaps another's tokens: the
// kernel is bound by the state's HBM traffic (64 KiB read + 64 KiB written per (sequence, v-head)).
// Token t, with d = e^{g_t}:
//   u       = k_t . (d S) = d a_t,                  a_t = k_t . S[:, v]  (S before token t)
//   delta   = beta_t (v_t[v] - u)
//   o_t[v]  = scale q_t . (d S + k_t delta) = scale (d c_t + (q_t . k_t) delta),   c_t = q_t . S[:, v]
//   S[:, v] = d S[:, v] + k_t delta
// One pass over the thread's rows a token: it applies token t's update and, on the updated rows,
// accumulates the warp's partial sums of token t + 1's a, c and q . k (the first token's come from a
// pass after the state load). The four warps' partials meet in shared memory (partials[t % 2]
// [warp][lane] = (a, c, q . k)), behind the token's one barrier; every warp then sums them for its
// lanes' columns and warp 0 writes o. (q and k are the runtime's L2-normalised copies when the call
// asks for the norm.) Initial and final states go through sequence_initial_state /
// sequence_final_state (pools, layouts, -1 slots); with token_states, the state after every token is
// kept too (speculative decoding's rollback).
// Token inputs: thread x loads q_t[x] and k_t[x], threads x < 32 also v_t[32 z + x], thread 32 g_t
// and 33 beta_t, into registers two tokens ahead, and stages them into TokenBuffer staged[t % 3]
// (shared memory) after the barrier that ends the last pass reading that buffer. Pass t reads
// tokens t and t + 1 (broadcast float4 reads: every lane of a warp reads the same rows).
#include <cuda_runtime.h>

#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {
namespace {

constexpr int kColumns = 32;                     // value columns a CTA (one a lane)
constexpr int kColumnBlocks = kHeadDim / kColumns;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = kHeadDim / kWarps;         // state rows a thread
static_assert(kThreads == kHeadDim, "one q and one k element a thread");

// A token's inputs for the CTA: q_t, k_t, this CTA's columns of v_t, the head's g_t and beta_t.
struct alignas(16) TokenBuffer {
  float q[kHeadDim], k[kHeadDim];
  float v[kColumns];
  float g, beta;
};
// What one thread loads of a token (registers until staged): q_t[x], k_t[x], and v / g / beta below.
struct TokenLoads {
  float q = 0.f, k = 0.f, other = 0.f;
};
template <typename Elem>
__device__ __forceinline__ TokenLoads load_token(const ForwardParams& p, int64_t b, int64_t t, int h, int hk) {
  const int x = threadIdx.x;
  TokenLoads in;
  in.q = to_float(row_ptr<Elem>(p.q, p.q_strides, b, t, hk)[x]);
  in.k = to_float(row_ptr<Elem>(p.k, p.k_strides, b, t, hk)[x]);
  if (x < kColumns)
    in.other = to_float(row_ptr<Elem>(p.v, p.v_strides, b, t, h)[kColumns * blockIdx.z + x]);
  else if (x == kColumns)
    in.other = p.g[b * p.g_strides.batch + t * p.g_strides.token + h * p.g_strides.head];
  else if (x == kColumns + 1)
    in.other = load_beta(p, b, t, h);
  return in;
}
__device__ __forceinline__ void stage(TokenBuffer& buffer, const TokenLoads& in) {
  const int x = threadIdx.x;
  buffer.q[x] = in.q;
  buffer.k[x] = in.k;
  if (x < kColumns) buffer.v[x] = in.other;
  else if (x == kColumns) buffer.g = in.other;
  else if (x == kColumns + 1) buffer.beta = in.other;
}

// Rows row0 .. row0 + kRows - 1 of column col of a state block (zeros when absent), or stores them.
// Where the rows are contiguous and 16-byte aligned (the V-first layout, k_stride 1) in 16-byte
// vectors; else one pointer stepped by the row stride, so that the kRows loads issue together
// without kRows addresses held in registers.
template <typename T>
__device__ __forceinline__ T* column_start(const StateBlock& s, int row0, int col) {
  return static_cast<T*>(s.base) + row0 * s.k_stride + col * s.v_stride;
}
__device__ __forceinline__ bool contiguous_run(const StateBlock& s, const void* at) {
  return s.k_stride == 1 && reinterpret_cast<uintptr_t>(at) % 16 == 0;
}
__device__ __forceinline__ void load_column(const StateBlock& s, int row0, int col, float (&x)[kRows]) {
  if (s.base == nullptr) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) x[r] = 0.f;
  } else if (s.bf16) {
    const __nv_bfloat16* at = column_start<__nv_bfloat16>(s, row0, col);
    if (contiguous_run(s, at)) {
#pragma unroll
      for (int r = 0; r < kRows; r += 8) {
        const uint4 words = *reinterpret_cast<const uint4*>(at + r);
        const uint32_t w[4] = {words.x, words.y, words.z, words.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 pair = unpack_pair<__nv_bfloat16>(w[i]);
          x[r + 2 * i] = pair.x, x[r + 2 * i + 1] = pair.y;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r, at += s.k_stride) x[r] = __bfloat162float(*at);
    }
  } else {
    const float* at = column_start<float>(s, row0, col);
    if (contiguous_run(s, at)) {
#pragma unroll
      for (int r = 0; r < kRows; r += 4) {
        const float4 v = *reinterpret_cast<const float4*>(at + r);
        x[r] = v.x, x[r + 1] = v.y, x[r + 2] = v.z, x[r + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r, at += s.k_stride) x[r] = *at;
    }
  }
}
__device__ __forceinline__ void store_column(const StateBlock& s, int row0, int col, const float (&x)[kRows]) {
  if (s.bf16) {
    __nv_bfloat16* at = column_start<__nv_bfloat16>(s, row0, col);
    if (contiguous_run(s, at)) {
#pragma unroll
      for (int r = 0; r < kRows; r += 8)
        store_global_16(at + r, pack_pair<__nv_bfloat16>(x[r], x[r + 1]), pack_pair<__nv_bfloat16>(x[r + 2], x[r + 3]),
                        pack_pair<__nv_bfloat16>(x[r + 4], x[r + 5]), pack_pair<__nv_bfloat16>(x[r + 6], x[r + 7]));
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r, at += s.k_stride) *at = __float2bfloat16_rn(x[r]);
    }
  } else {
    float* at = column_start<float>(s, row0, col);
    if (contiguous_run(s, at)) {
#pragma unroll
      for (int r = 0; r < kRows; r += 4)
        store_global_16(at + r, __float_as_uint(x[r]), __float_as_uint(x[r + 1]), __float_as_uint(x[r + 2]),
                        __float_as_uint(x[r + 3]));
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r, at += s.k_stride) *at = x[r];
    }
  }
}

// The warp's partial sums over its rows: a = k_t . S, c = q_t . S (this lane's column), q_t . k_t.
struct Partials {
  float a = 0.f, c = 0.f, qk = 0.f;
};

template <typename Elem>
__global__ void __launch_bounds__(kThreads, 5) recurrent_decode_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_previous_grid();
  release_next_grid();
  __shared__ TokenBuffer staged[3];            // token i in staged[i % 3]
  __shared__ float4 partials[2][kWarps][32];  // token i's in partials[i % 2]: (a, c, q . k, -)
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const int hk = h / (p.num_v_heads / p.num_qk_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = kColumns * blockIdx.z + lane, row0 = kRows * warp;
  const SequenceBounds seq = sequence_bounds(p, n);
  const int64_t b = seq.batch;
  // A decode sequence's tokens fit 32 bits (its q alone would need 2^31 x 256 bytes otherwise).
  const int tokens = static_cast<int>(seq.eos - seq.bos);

  // In flight together with the state: tokens 0, 1 (staged now) and 2 (staged at token 0).
  TokenLoads token0, token1, ahead;
  if (tokens > 0) token0 = load_token<Elem>(p, b, seq.bos, h, hk);
  if (tokens > 1) token1 = load_token<Elem>(p, b, seq.bos + 1, h, hk);
  if (tokens > 2) ahead = load_token<Elem>(p, b, seq.bos + 2, h, hk);
  float state[kRows];
  load_column(sequence_initial_state(p, n, h), row0, col, state);
  stage(staged[0], token0);
  stage(staged[1], token1);
  __syncthreads();

  Partials part;  // token 0's over the thread's rows
  if (tokens > 0) {
    const float* q_t = &staged[0].q[row0];
    const float* k_t = &staged[0].k[row0];
#pragma unroll
    for (int r = 0; r < kRows; r += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(k_t + r);
      const float4 q4 = *reinterpret_cast<const float4*>(q_t + r);
      part.a += k4.x * state[r] + k4.y * state[r + 1] + k4.z * state[r + 2] + k4.w * state[r + 3];
      part.c += q4.x * state[r] + q4.y * state[r + 1] + q4.z * state[r + 2] + q4.w * state[r + 3];
      part.qk += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
    }
  }

  for (int i = 0; i < tokens; ++i) {
    const int64_t t = seq.bos + i;
    partials[i % 2][warp][lane] = make_float4(part.a, part.c, part.qk, 0.f);
    // Pass i - 1 is done everywhere: staged[(i + 2) % 3] (token i - 1's) is free, and partials[i % 2]
    // (token i - 2's, read before pass i - 1) has token i's.
    __syncthreads();
    if (i + 2 < tokens) stage(staged[(i + 2) % 3], ahead);
    if (i + 3 < tokens) ahead = load_token<Elem>(p, b, t + 3, h, hk);

    float a = 0.f, c = 0.f, qk_dot = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 sum = partials[i % 2][w][lane];
      a += sum.x, c += sum.y, qk_dot += sum.z;
    }
    const TokenBuffer& now = staged[i % 3];
    const float decay = __expf(now.g);
    const float delta = now.beta * (now.v[lane] - decay * a);
    if (p.o != nullptr && warp == 0)
      static_cast<Elem*>(p.o)[b * p.o_strides.batch + t * p.o_strides.token + h * p.o_strides.head + col] =
          to_elem<Elem>(p.scale * (decay * c + qk_dot * delta));

    // Pass i: S = d S + k_i delta, and on the new rows token i + 1's partials.
    const float* k_t = &now.k[row0];
    part = Partials{};
    if (i + 1 < tokens) {
      const float* q_next = &staged[(i + 1) % 3].q[row0];
      const float* k_next = &staged[(i + 1) % 3].k[row0];
#pragma unroll
      for (int r = 0; r < kRows; r += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(k_t + r);
        const float4 kn = *reinterpret_cast<const float4*>(k_next + r);
        const float4 qn = *reinterpret_cast<const float4*>(q_next + r);
        state[r] = fmaf(decay, state[r], k4.x * delta), state[r + 1] = fmaf(decay, state[r + 1], k4.y * delta);
        state[r + 2] = fmaf(decay, state[r + 2], k4.z * delta), state[r + 3] = fmaf(decay, state[r + 3], k4.w * delta);
        part.a += kn.x * state[r] + kn.y * state[r + 1] + kn.z * state[r + 2] + kn.w * state[r + 3];
        part.c += qn.x * state[r] + qn.y * state[r + 1] + qn.z * state[r + 2] + qn.w * state[r + 3];
        part.qk += qn.x * kn.x + qn.y * kn.y + qn.z * kn.z + qn.w * kn.w;
      }
    } else {
#pragma unroll
      for (int r = 0; r < kRows; r += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(k_t + r);
        state[r] = fmaf(decay, state[r], k4.x * delta), state[r + 1] = fmaf(decay, state[r + 1], k4.y * delta);
        state[r + 2] = fmaf(decay, state[r + 2], k4.z * delta), state[r + 3] = fmaf(decay, state[r + 3], k4.w * delta);
      }
    }
    if (p.token_states != nullptr)  // for rolling back rejected speculative tokens
      store_column(user_state(p.token_states, p.token_state_strides, p.state_vk, b * p.seqlen + t, h), row0, col, state);
  }

  const StateBlock final = sequence_final_state(p, n, h);
  if (final.base != nullptr) store_column(final, row0, col, state);
}

}  // namespace

template <ElemKind E>
cudaError_t launch_recurrent_decode(const ForwardParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return cudaSuccess;
  return launch_kernel(recurrent_decode_kernel<ElemType<E>>,
                       dim3(static_cast<unsigned>(p.num_seqs), p.num_v_heads, kColumnBlocks), kThreads, 0, stream, p);
}
template cudaError_t launch_recurrent_decode<ElemKind::kBF16>(const ForwardParams&, cudaStream_t);
template cudaError_t launch_recurrent_decode<ElemKind::kF16>(const ForwardParams&, cudaStream_t);

}  // namespace flashgdn::kern
