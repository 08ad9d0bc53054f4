// Small backward kernels around the fused one:
//   qk_grads            one warp per (token, q/k head) of dq or dk: the fp32 per-v-head gradients
//                       summed over the head's group of Hv/Hqk v-heads, then (with the in-kernel
//                       L2 norm) through x / sqrt(|x|^2 + 1e-6):  dx = (dy - y (y . dy)) / n,
//                       y = x / n; written in q's dtype. Tokens past cu_seqlens[N] get zeros.
//   zero_grad_padding   grid-stride: dv, dg, dbeta (and dq, dk without qk_grads) of tokens past
//                       cu_seqlens[N] set to zero (varlen)
#include <cuda_runtime.h>

#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/warp_mma.cuh"

namespace flashgdn::kern {
namespace {

template <typename Elem>
__global__ void qk_grads_kernel(const BackwardParams bp) {
  wait_for_previous_grid();
  release_next_grid();
  const ForwardParams& p = bp.fwd;
  const bool is_k = blockIdx.y == 1;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t rows = p.batch * p.seqlen * p.num_qk_heads;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int hk = static_cast<int>(row % p.num_qk_heads);
  const int64_t bt = row / p.num_qk_heads;  // b * seqlen + t
  const int64_t t = bt % p.seqlen, b = bt / p.seqlen;
  const RowStrides& out_strides = is_k ? bp.dk_strides : bp.dq_strides;
  Elem* out = static_cast<Elem*>(is_k ? bp.dk : bp.dq) + b * out_strides.batch + t * out_strides.token +
              hk * out_strides.head + 4 * lane;
  float dy[4] = {0.f, 0.f, 0.f, 0.f};
  const bool padding = p.cu_seqlens != nullptr && t >= cu_seqlens_at(p, p.num_seqs);
  if (!padding) {
    const int group = p.num_v_heads / p.num_qk_heads;
    const float* heads = (is_k ? bp.dk_heads : bp.dq_heads) + (bt * p.num_v_heads + hk * group) * kHeadDim + 4 * lane;
    for (int r = 0; r < group; ++r) {
      const float4 x = *reinterpret_cast<const float4*>(heads + r * kHeadDim);
      dy[0] += x.x;
      dy[1] += x.y;
      dy[2] += x.z;
      dy[3] += x.w;
    }
    if (bp.l2norm) {
      const Elem* raw = row_ptr<Elem>(is_k ? bp.k_raw : bp.q_raw, is_k ? bp.k_raw_strides : bp.q_raw_strides, b, t,
                                      hk) + 4 * lane;
      float x[4], sum = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[i] = to_float(raw[i]);
        sum += x[i] * x[i];
      }
      sum = warp_sum(sum);
      const float inv = rsqrtf(sum + 1e-6f);
      float ydy = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) ydy += x[i] * inv * dy[i];
      ydy = warp_sum(ydy);
#pragma unroll
      for (int i = 0; i < 4; ++i) dy[i] = (dy[i] - x[i] * inv * ydy) * inv;
    }
  }
  store_pair(out, dy[0], dy[1]);
  store_pair(out + 2, dy[2], dy[3]);
}

template <typename Elem>
__global__ void zero_grad_padding_kernel(const BackwardParams bp) {
  wait_for_previous_grid();
  release_next_grid();
  const ForwardParams& p = bp.fwd;
  const int64_t first = cu_seqlens_at(p, p.num_seqs);
  // dv vectors, dg and dbeta, then (direct_qk, group_sums: no qk_grads pass) dq and dk vectors
  const int64_t qk_vectors = bp.direct_qk || bp.group_sums ? 2 * p.num_qk_heads * (kHeadDim / 8) : 0;
  const int64_t per_token = p.num_v_heads * (kHeadDim / 8 + 2) + qk_vectors;
  const int64_t items = (p.seqlen - first) * per_token;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < items;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = first + e / per_token, item = e % per_token;
    if (item < p.num_v_heads * (kHeadDim / 8)) {
      const int64_t h = item / (kHeadDim / 8), vec = item % (kHeadDim / 8);
      Elem* dv = static_cast<Elem*>(bp.dv) + t * bp.dv_strides.token + h * bp.dv_strides.head + vec * 8;
      *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
    } else if (item >= p.num_v_heads * (kHeadDim / 8 + 2)) {
      const int64_t rest = item - p.num_v_heads * (kHeadDim / 8 + 2), hk = rest / (kHeadDim / 8) % p.num_qk_heads;
      const bool is_k = rest >= p.num_qk_heads * (kHeadDim / 8);
      const RowStrides& s = is_k ? bp.dk_strides : bp.dq_strides;
      Elem* out = static_cast<Elem*>(is_k ? bp.dk : bp.dq) + t * s.token + hk * s.head + (rest % (kHeadDim / 8)) * 8;
      *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0);
    } else {
      const int64_t rest = item - p.num_v_heads * (kHeadDim / 8), h = rest / 2;
      if (rest % 2 == 0) {
        bp.dg[t * bp.dg_strides.token + h * bp.dg_strides.head] = 0.f;
      } else {
        const int64_t off = t * bp.dbeta_strides.token + h * bp.dbeta_strides.head;
        if (p.beta_is_bf16)
          static_cast<__nv_bfloat16*>(bp.dbeta)[off] = __float2bfloat16_rn(0.f);
        else
          static_cast<float*>(bp.dbeta)[off] = 0.f;
      }
    }
  }
}

}  // namespace

template <ElemKind E>
cudaError_t launch_qk_grads(const BackwardParams& bp, cudaStream_t stream) {
  const ForwardParams& p = bp.fwd;
  const int64_t rows = p.batch * p.seqlen * p.num_qk_heads;
  if (rows == 0) return cudaSuccess;
  constexpr int kRowsPerBlock = 8;
  return launch_kernel(qk_grads_kernel<ElemType<E>>,
                       dim3(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 2), 32 * kRowsPerBlock,
                       0, stream, bp);
}
template cudaError_t launch_qk_grads<ElemKind::kBF16>(const BackwardParams&, cudaStream_t);
template cudaError_t launch_qk_grads<ElemKind::kF16>(const BackwardParams&, cudaStream_t);

cudaError_t launch_zero_grad_padding(const BackwardParams& bp, ElemKind elem, cudaStream_t stream) {
  const ForwardParams& p = bp.fwd;
  const int64_t items = p.seqlen * (p.num_v_heads * (kHeadDim / 8 + 2) + 2 * p.num_qk_heads * (kHeadDim / 8));
  if (items == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((items + 255) / 256, 1024));
  return launch_kernel(elem == ElemKind::kBF16 ? zero_grad_padding_kernel<__nv_bfloat16> : zero_grad_padding_kernel<__half>,
                       blocks, 256, 0, stream, bp);
}

}  // namespace flashgdn::kern
