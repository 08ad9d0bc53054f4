// Parameters of the SM90 forward kernels: plain C++ (shared by the host runtime and the .cu files).
#pragma once

#include <cstdint>

namespace flashgdn::kern {

inline constexpr int kChunk = 64;     // tokens per chunk
inline constexpr int kHeadDim = 128;  // K = V = 128
// Most sequences a call orders longest first (ForwardParams::sequence_order): item_offsets sorts them in
// one block's shared memory; calls with more keep the natural order.
inline constexpr int64_t kMaxOrderedSequences = 4096;
// The ordered grid (1, Hv, N) takes the sequence rank as blockIdx.z (sequence.cuh heads_fastest), and
// gridDim.z is at most 65535; its launchers refuse more sequences than the cap.
static_assert(kMaxOrderedSequences <= 65535, "the ordered grid's z is the sequence rank: gridDim.z <= 65535");

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

  // States (fp32 or bf16 storage), (n, hv, 128, 128); state_vk: stored [V][K] instead of [K][V].
  const void* initial_state = nullptr;
  void* final_state = nullptr;
  bool initial_state_bf16 = false, final_state_bf16 = false;
  int64_t initial_state_strides[4] = {0, 0, 0, 0};
  int64_t final_state_strides[4] = {0, 0, 0, 0};
  bool state_vk = false;
  float* checkpoints = nullptr;                  // state every checkpoint_chunks chunks (fp32, states layout)
  int64_t checkpoint_strides[4] = {0, 0, 0, 0};
  int64_t checkpoint_chunks = 0;
  int32_t* checkpoint_offsets = nullptr;         // varlen: first checkpoint row of each sequence (N + 1)
  float* token_states = nullptr;                 // decode: the state after every token, row b * seqlen + t
  int64_t token_state_strides[4] = {0, 0, 0, 0};
  const int32_t* initial_state_slots = nullptr;  // pools: [N] slot per sequence, -1 = zero start
  const int32_t* final_state_slots = nullptr;    // pools: [N] slot per sequence, -1 = not written

  // Problem.
  int64_t batch = 1, seqlen = 0, num_seqs = 0;
  int32_t num_qk_heads = 0, num_v_heads = 0;
  float scale = 1.f;
  const void* cu_seqlens = nullptr;  // null in batch mode
  bool cu_seqlens_is_i64 = false;

  // Workspace.
  int32_t* chunk_offsets = nullptr;  // varlen: first global chunk of each sequence (num_seqs + 1)
  // Varlen without CP (runtime/common.cpp prepare_inputs): the sequences longest first (ties by index;
  // num_seqs entries, written with chunk_offsets by item_offsets), for the per-item kernels v4, v5 and
  // the dS pass: their CTAs take the items in this order, v-heads fastest (grid (1, Hv, N): heads_fastest,
  // item_sequence_and_head in sequence.cuh). Null: the natural order (sequence x of CTA (x, h)); v1-v3
  // always run it.
  const int32_t* sequence_order = nullptr;
  // The stream's previous kernel writes the item tables (chunk_offsets, sequence_order): v4 and v5
  // wait before their item lookups instead of starting early (fused_forward_starts_early). The
  // backward with the inverse cache, whose pre-pass follows item_offsets directly.
  bool item_tables_pending = false;
  int64_t max_chunks = 0;            // launch bound on the number of chunks
  int32_t v_split = 1;               // fused forward: CTAs per (sequence or segment, v-head), 1 or 2,
                                     // each with 128 / v_split value columns of the state
  bool wgmma = false;                // fused forward: the wgmma kernel (fused_forward_wg.cuh, v_split 1)
  bool warp_specialized = false;     // fused forward: the warp-specialized kernel (fused_forward_ws.cuh)
  bool register_state = false;       // fused forward: the register-state kernel (fused_forward_rs.cuh)
  bool inverse_inside = false;       // fused forward: the kernel forming A_r itself (fused_forward_inv.cuh;
                                     // chunk_gates from launch_chunk_gates, no chunk inverse)
  void* inverse = nullptr;           // A_r rows, (b * seqlen + t, hv, 64), fp32 or bf16
  bool gated_inverse = false;        // the chunk inverse writes Ag = G (.) A_r (.) 1 beta^T in the input
                                     // dtype instead of A_r (the v4 forward, which TMAs it into place)
  // The register-state forward without o (the backward's pre-pass with d_final_state): its
  // kExactUpdate kernel, the state update's operand rho Vd as bf16 hi + lo (4 more wgmmas a chunk).
  // A sequence ending in a short chunk takes its last token's dg from <dht, S> against the state
  // entering it; one bf16 operand left that dot up to ~5e-2 off (bench/precision_study,
  // KernelRounding::prepass_states). Beside gated_inverse: in its padding.
  bool exact_state_update = false;
  void* gated_inverse_out = nullptr;  // the fp32 chunk inverse writes Ag there too, in the input dtype
                                      // (the backward: fp32 A_r for itself, Ag for its v4 pre-pass); the
                                      // 16-bit one too, with inverse_rows_fp16 only
  bool inverse_rows_fp16 = false;     // the fp32 chunk inverse with fp16 merges writes A_r's rows in fp16
                                      // (exact: its merges hold X in fp16), as the backward's gradient
                                      // pass reads them; half the bytes of fp32 rows. The 16-bit inverse
                                      // writes the same bytes (fp16 rows and Ag; gated_inverse_out
                                      // required: the forward keeping the inverse cache)
  int32_t inverse_heads_per_cta = 0;  // chunk inverse: v-heads of one q/k head per CTA, 1-4; 0: its
                                      // launcher chooses (ChunkInverse::heads_per_cta)
  float* chunk_gates = nullptr;      // [chunk id][hv][gcum 64 | beta 64] fp32 (chunk_gates.cuh), written
                                     // by the chunk inverse where non-null; read by the v4 forward
  // FLASHGDN_TIMELINE builds only (kernels/sm90/timeline.cuh): clock64() at the phase boundaries of
  // the warp-specialized forwards' CTA (0, 0, 0); null: not recorded.
  unsigned long long* timeline = nullptr;
  // Backward pre-pass only (the v4 forward): the state entering every chunk, transposed, dtype of q,
  // [chunk id][hv][128][128] (S^T: V rows, K columns; chunk id = first chunk of the sequence + chunk).
  // o may then be null.
  void* chunk_states = nullptr;
  // With chunk_states and the backward's d_final_state (fp32, states layout): <dS_T, S> of every
  // sequence's (or shard's) last chunk, S the state entering it in fp32 (not chunk_states' bf16:
  // dS_T is a large random-signed gradient, its dot with a bf16 S loses up to 8e-3 of dg on a short
  // last chunk), as 8 per-warp partials into final_grad_dots[chunk id][hv][8], for the gradient
  // pass's dgamma (it forms every other chunk's from its S^T and dS^T tiles). Null: not computed.
  const float* final_grad = nullptr;
  int64_t final_grad_strides[4] = {0, 0, 0, 0};
  float* final_grad_dots = nullptr;

  // Intra-card context parallelism (cp_pass != kNoCp): blockIdx.x enumerates segments, each
  // sequence cut into ceil(C / segment_chunks) balanced segments (locate_segment, sequence.cuh).
  int32_t cp_pass = 0;                   // CpPass
  int64_t segment_chunks = 0;            // L
  int64_t max_segments = 0;              // launch bound on the number of segments
  int32_t* segment_offsets = nullptr;    // varlen: first segment of each sequence (num_seqs + 1)
  int32_t* window_chunks = nullptr;      // [segment][hv]: trailing chunks the state pass runs; 0: the
                                         // whole segment and its transition M (no decay window)
  float* segment_ends = nullptr;         // [segment][hv][128][128]: S*_j, state at the segment's end
  float* segment_transitions = nullptr;  // [segment][hv][128][128]: M_j (heads without a window)
  float* segment_starts = nullptr;       // [segment][hv][128][128]: S_j entering the segment (h0 for j = 0)
  // The CP cache. The forward's (cache_transitions): its state pass also forms the last segments'
  // M_j where the window is missing (for the backward's final-state gradient). The backward's
  // (segment_starts_given, segment_starts and segment_transitions the forward's): the state pass
  // forms no S*_j, and only the M_j the reverse correction needs where the forward formed none
  // (its window, window_chunks, not missing).
  bool cache_transitions = false;
  bool segment_starts_given = false;
  float decay_threshold = -10.f;         // natural-log units
  // [chunk id][hv]: each chunk's sum of the window terms g_t + log max(1, |1 - beta_t |k_t|^2|), written
  // by the bf16 chunk inverse where non-null (|k_t|^2 is K K^T's diagonal there; it needs the gates:
  // chunk_gates or gated_inverse set) and read by cp_windows instead of every token's K row.
  float* chunk_window_terms = nullptr;
  // Backward CP (the backward's pre-pass): leading decay windows of the dS* pass, 0 where the
  // reverse correction needs M_j (the state pass then forms it too, for the last segment as well
  // when transition_for_last: a final-state gradient flows back through it).
  int32_t* grad_window_chunks = nullptr;
  bool transition_for_last = false;
  // Shard phases (inter-GPU CP, flashgdn::ShardPhase): the entering state is unknown at the state
  // pass, so every segment is treated like a later one: S*_j of every segment (the last too) from
  // zero, M_j of every segment without a window (the first and the last too), and the correction
  // applies M_0 to h0. shard_maps: fp32 [2 N][hv][128][128], E then M of each whole sequence.
  bool shard = false;
  float* shard_maps = nullptr;
};

// Passes of the CP forward; the state pass runs S*_j with blockIdx.z == 0 and M_j with z == 1.
enum CpPass : int32_t { kNoCp = 0, kCpStatePass = 1, kCpMainPass = 2 };

// Inter-GPU CP over NCCL (flashgdn::distributed): the scan over every rank's shard maps,
// S_0 = h0, S_{j+1} = E_j + M_j S_j: S_rank -> entering, S_world -> final_state.
struct ShardScanParams {
  const float* maps = nullptr;  // [world][2 N][hv][128][128]: rank j's E_j (rows 0..N-1), M_j (rows N..2N-1)
  int32_t world = 0, rank = 0, num_v_heads = 0;
  int64_t num_seqs = 0;
  const void* initial_state = nullptr;  // optional, [N][hv] states in the user layout (fp32 or bf16)
  int64_t initial_state_strides[4] = {0, 0, 0, 0};
  bool initial_state_bf16 = false;
  float* entering = nullptr;            // [N][hv][128][128] fp32, K-major
  void* final_state = nullptr;          // optional, user layout (fp32 or bf16)
  int64_t final_state_strides[4] = {0, 0, 0, 0};
  bool final_state_bf16 = false;
  bool state_vk = false;                // layout of initial_state and final_state
};

// The backward's scan over the ranks: dS_world = dht, dS_j = D_j + M_j^T dS_{j+1} for
// j = world-1 .. rank+1 -> d_out, the gradient leaving this rank's slice.
struct ShardGradScanParams {
  const float* maps = nullptr;      // as ShardScanParams::maps (M_j used)
  const float* reaching = nullptr;  // [world][N][hv][128][128]: rank j's D_j
  int32_t world = 0, rank = 0, num_v_heads = 0;
  int64_t num_seqs = 0;
  const float* d_final_state = nullptr;  // optional, fp32, the user layout
  int64_t d_final_state_strides[4] = {0, 0, 0, 0};
  bool state_vk = false;
  float* d_out = nullptr;                // [N][hv][128][128] fp32, K-major
};

// The backward reads the forward's inputs and workspace through `fwd` (the fp32 inverse, its rows in
// fp16 with fp16 merges: inverse_rows_fp16).
struct BackwardParams {
  ForwardParams fwd;
  const void* d_o = nullptr;  // (b, t, hv, 128), dtype of v
  RowStrides d_o_strides;
  const float* d_final_state = nullptr;  // optional, states layout of fwd
  float* d_initial_state = nullptr;      // present exactly when fwd.initial_state is
  int64_t d_final_state_strides[4] = {0, 0, 0, 0};
  int64_t d_initial_state_strides[4] = {0, 0, 0, 0};

  // Per-v-head outputs.
  void* dv = nullptr;  // (b, t, hv, 128), dtype of v
  float* dg = nullptr;  // (b, t, hv)
  void* dbeta = nullptr;  // (b, t, hv), dtype of beta
  RowStrides dv_strides, dg_strides, dbeta_strides;

  // dq, dk of every v-head in fp32, (b * seqlen + t, hv, 128) (workspace), then summed over each
  // group of v-heads (and through the L2 norm) into dq, dk (b, t, hqk, 128), dtype of q. With
  // direct_qk (Hv == Hqk, no L2 norm: nothing to sum or chain) the gradient pass writes dq, dk.
  // With group_sums (Hv > Hqk, no L2 norm) it sums them itself: a CTA takes a group's v-heads of a
  // chunk in a row, the running sum in dq_heads as [chunk, hk][dq, dk][64][128] (backward_grads.cuh).
  bool direct_qk = false;
  bool group_sums = false;
  float* dq_heads = nullptr;
  float* dk_heads = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  RowStrides dq_strides, dk_strides;
  // Raw q, k when the forward normalised them (fwd.q/fwd.k then point at the normalised copies).
  const void* q_raw = nullptr;
  const void* k_raw = nullptr;
  RowStrides q_raw_strides, k_raw_strides;
  bool l2norm = false;

  // Backward CP (fwd.cp_pass: kCpStatePass runs the dS* pass, kCpMainPass the dS pass's main
  // mode over every segment, then the gradient pass); windows in fwd.grad_window_chunks.
  float* segment_grad_starts = nullptr;  // [segment][hv][128][128]: dS*_j w.r.t. the state entering segment j
  float* segment_grad_ends = nullptr;    // [segment][hv][128][128]: dS_{j+1} w.r.t. the state leaving segment j
  // Backward shard maps (fwd.shard): fp32 [N][hv][128][128], D = the gradient reaching each
  // sequence's entering state from d_o alone (dht = 0).
  float* shard_grad = nullptr;
  // The dS pass's main mode (fwd.cp_pass kNoCp or kCpMainPass): the state gradient leaving every
  // chunk, transposed, dtype of q, [chunk id][hv][128][128] (dS^T: V rows, K columns; chunk_states'
  // layout), for the gradient pass.
  void* chunk_grad_states = nullptr;
};

}  // namespace flashgdn::kern
