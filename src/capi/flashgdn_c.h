/* flashgdn C ABI: the C++ API flattened for foreign-function callers (the Python package loads
 * it with ctypes, so the binding needs no compiler and no torch headers). Every function returns
 * a flashgdn::StatusCode value (0 = ok) and writes the status message into msg (NUL-terminated,
 * truncated to msg_len). Tensor and problem fields mean what they mean in include/flashgdn/. */
#ifndef FLASHGDN_C_H_
#define FLASHGDN_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  void* data;
  int32_t dtype; /* flashgdn::DType */
  int32_t rank;
  int64_t sizes[4];
  int64_t strides[4]; /* elements */
} flashgdn_tensor;

typedef struct {
  int64_t batch, seqlen;
  int32_t num_qk_heads, num_v_heads, head_dim_k, head_dim_v;
  flashgdn_tensor q, k, v, g, beta, initial_state;
  const void* cu_seqlens; /* null: batch mode */
  int32_t cu_seqlens_dtype;
  int64_t num_seqs;
  const int64_t* cu_seqlens_host; /* optional */
  int32_t state_v_first;
  int32_t has_scale;
  float scale;
  int32_t use_qk_l2norm_in_kernel;
  int32_t context_parallel;   /* 0 auto, 1 off, 2 on (flashgdn::ContextParallel) */
  int64_t cp_segment_chunks;  /* 0: the planner's choice */
  float cp_decay_threshold;   /* 0: the default (-10) */
  flashgdn_tensor initial_state_indices; /* optional int32 [N]: pool slots of the initial states */
} flashgdn_inputs;

typedef struct {
  flashgdn_tensor o, final_state;
  flashgdn_tensor final_state_indices; /* optional int32 [N]: pool slots of the final states */
  flashgdn_tensor checkpoints;         /* optional fp32 states every checkpoint_chunks chunks */
  int64_t checkpoint_chunks;
  flashgdn_tensor token_states;        /* optional fp32 state after every token (decode-sized calls) */
  int32_t shard_phase;                 /* flashgdn::ShardPhase: 0 none, 1 maps, 2 finish */
  flashgdn_tensor shard_maps;          /* phase 1 output: fp32 [2 N, Hv, K, K], E then M */
  flashgdn_tensor cp_states;           /* optional CP cache for the backward: fp32 [segments, Hv, K, V] */
  flashgdn_tensor cp_transitions;      /* ... and fp32 [segments, Hv, K, K] (both or neither) */
  flashgdn_tensor inverse_cache;       /* optional for the backward: uint8 [flashgdn_forward_inverse_cache_bytes] */
} flashgdn_forward_outputs;

typedef struct {
  flashgdn_tensor d_o, d_final_state, dq, dk, dv, dg, dbeta, d_initial_state;
  int32_t shard_phase;        /* flashgdn::ShardPhase: 0 none, 1 maps, 2 finish */
  flashgdn_tensor shard_grad; /* phase 1 output: fp32 [N, Hv, K, V] */
  int32_t inverse_fp32;       /* 1: the chunk inverse merged in split bf16 (BackwardProblem::inverse_fp32) */
  flashgdn_tensor cp_states;  /* optional: the forward's CP cache (its cp_states, cp_transitions) ... */
  flashgdn_tensor cp_transitions;
  int64_t cp_segment_chunks;  /* ... and its cut (flashgdn_forward_cp_cache_shape); 0 without */
  flashgdn_tensor inverse_cache; /* optional: the forward's inverse cache (read only) */
} flashgdn_backward_tensors;

const char* flashgdn_version(void);
/* sizeof flashgdn_tensor, flashgdn_inputs, flashgdn_forward_outputs and flashgdn_backward_tensors into
 * sizes[0 .. count) (count <= 4); returns 4. Foreign-function mirrors of the structs check theirs against
 * it (the Python package does at import), so that a library and a binding from different versions fail
 * loudly instead of reading past a struct. */
int flashgdn_struct_sizes(size_t* sizes, int count);
/* 1 when this build has the SM90 kernels. */
int flashgdn_has_kernels(void);

/* Measurement builds (-DFLASHGDN_TIMELINE=ON) only: the device buffer, uint64 [2][128][8], into which
 * the warp-specialized forwards (variant kernel 3 or 4) of later flashgdn_forward calls write the
 * clock64() of their phase boundaries (src/kernels/sm90/timeline.cuh; bench/timeline.py reads it);
 * NULL: none (set it before freeing the buffer). Other builds return 2 (not supported), or 3 (not
 * built) without kernels. */
int flashgdn_set_timeline(void* device_buffer, char* msg, int msg_len);

/* variant (for measurements and tests; 0 = the defaults): bit 0 stores the gate-free inverse in fp32
 * instead of bf16; bits 1-2 pin the mma.sync fused kernel's V split (0 automatic, 1 or 2); bits 3-5 pick
 * the fused kernel (0 automatic: wgmma unless a V split is pinned, 1 mma.sync, 2 wgmma, 3 warp-specialized
 * wgmma, 4 warp-specialized with the state in registers). */
int flashgdn_forward_workspace_size(const flashgdn_inputs* in, const flashgdn_forward_outputs* out,
                                    int variant, size_t* bytes, char* msg, int msg_len);
/* The intra-card CP cut the forward runs (flashgdn::forward_cp_cache_shape): *segment_chunks = 0 without
 * CP, else the cut and *segments the rows of its cp_states. Host-only, no sync. */
int flashgdn_forward_cp_cache_shape(const flashgdn_inputs* in, const flashgdn_forward_outputs* out,
                                    int64_t* segment_chunks, int64_t* segments, char* msg, int msg_len);
/* The bytes of the forward's inverse cache (flashgdn::forward_inverse_cache_bytes): 0 where the forward runs
 * no chunk inverse the backward can take (decode-sized calls, shard phases). Host-only, no sync. */
int flashgdn_forward_inverse_cache_bytes(const flashgdn_inputs* in, const flashgdn_forward_outputs* out,
                                         size_t* bytes, char* msg, int msg_len);
int flashgdn_forward(const flashgdn_inputs* in, const flashgdn_forward_outputs* out, int variant,
                     void* workspace, size_t workspace_bytes, void* stream, char* msg, int msg_len);
int flashgdn_backward_workspace_size(const flashgdn_inputs* in, const flashgdn_backward_tensors* grads,
                                     size_t* bytes, char* msg, int msg_len);
int flashgdn_backward(const flashgdn_inputs* in, const flashgdn_backward_tensors* grads, void* workspace,
                      size_t workspace_bytes, void* stream, char* msg, int msg_len);

/* The float64 reference on host memory. */
int flashgdn_reference_forward(const flashgdn_inputs* in, const flashgdn_forward_outputs* out, char* msg,
                               int msg_len);
int flashgdn_reference_backward(const flashgdn_inputs* in, const flashgdn_backward_tensors* grads, char* msg,
                                int msg_len);

#ifdef __cplusplus
}
#endif

#endif /* FLASHGDN_C_H_ */
