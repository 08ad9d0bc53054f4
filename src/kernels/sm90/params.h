// Parameters of the SM90 forward kernels: plain C++ (shared by the host runtime and the .cu files).
#pragma once

#include <cstdint>

namespace flashgdn::kern {

inline constexpr int kChunk = 64;     // tokens per chunk
inline constexpr int kHeadDim = 128;  // K = V = 128

// Strides in elements of a (batch, token, head[, dim]) tensor; the dim stride is 1.
struct RowStrides {
  int64_t batch = 0, token = 0, head = 0;
};

struct ForwardParams {
  // Inputs. q/k are the L2-normalised workspace copies when the problem asks for the norm.
  const void* q = nullptr;      // (b, t, hqk, 128) bf16/fp16
  const void* k = nullptr;      // (b, t, hqk, 128)
  const void* v = nullptr;      // (b, t, hv, 128)
  const float* g = nullptr;     // (b, t, hv)
  const void* beta = nullptr;   // (b, t, hv) fp32 or bf16
  RowStrides q_strides, k_strides, v_strides, g_strides, beta_strides;
  bool beta_is_bf16 = false;

  // Outputs.
  void* o = nullptr;  // (b, t, hv, 128), dtype of v
  RowStrides o_strides;

  // States (fp32), (n, hv, 128, 128); state_vk: stored [V][K] instead of [K][V].
  const float* initial_state = nullptr;
  float* final_state = nullptr;
  int64_t initial_state_strides[4] = {0, 0, 0, 0};
  int64_t final_state_strides[4] = {0, 0, 0, 0};
  bool state_vk = false;

  // Problem.
  int64_t batch = 1, seqlen = 0, num_seqs = 0;
  int32_t num_qk_heads = 0, num_v_heads = 0;
  float scale = 1.f;
  const void* cu_seqlens = nullptr;  // null in batch mode
  bool cu_seqlens_is_i64 = false;

  // Workspace.
  int32_t* chunk_offsets = nullptr;  // varlen: first global chunk of each sequence (num_seqs + 1)
  int64_t max_chunks = 0;            // launch bound on the number of chunks
  void* inverse = nullptr;           // A_r rows, (b * seqlen + t, hv, 64), fp32 or bf16
};

}  // namespace flashgdn::kern
