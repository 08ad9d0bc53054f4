// Intra-card context parallelism (auto-CP) of the forward: the kernels around the two passes of
// the fused forward over segments (DESIGN §1; float64 reference: src/reference/cp.cpp).
//
// A sequence of C chunks is cut into n = ceil(C / L) balanced segments of floor(C / n) or
// floor(C / n) + 1 chunks, the longer first (locate_segment in sequence.cuh).
// Launch sequence (runtime/forward.cpp):
//   [segment_offsets]  varlen: first segment of each sequence
//   cp_windows         grid (segments, Hv), 256 threads (16 chunks a tile in parallel; 256 from the
//                      chunk inverse's per-chunk sums where it wrote them, p.chunk_window_terms): walking the
//                      chunks of segment j backwards from its end, the summed log of a bound on each
//                      token's map norm, g_t + log max(1, |1 - beta_t |k_t|^2|) (the map
//                      e^{g}(I - beta k k^T) has norm e^{g} max(1, |1 - beta |k|^2|)), until it is
//                      <= decay_threshold: window_chunks = that many chunks; 0 when the segment never
//                      gets there (then the exact transition M_j is formed). Any keys, normalised or
//                      not, get a valid bound.
//   fused_forward      state pass: S*_j of every segment but the last from zero over its window
//                      (from h0 over the whole first segment when it has no window), and M_j
//   cp_correction      grid (N, Hv, 128 / kCols column slices: kCols 16 where N x Hv x 8 CTAs fit one
//                      wave, else 32, plan::correction_slice_cols), 256 threads, over the boundaries of one
//                      sequence: S_0 = h0 (or zero; an empty sequence's final state), S_1 = S*_0
//                      and, for j >= 1,
//                        S_{j+1} = S*_j + M_j S_j   (no window)      S_{j+1} = S*_j   (window)
//                      -> segment_starts. The copies (window) depend on nothing: all at once,
//                      while the first M steps' inputs load. The M steps run serially:
//                      [128,kCols] = [128,128] @ [128,kCols] on tensor cores, 2 warpgroups x 8
//                      k-steps x 3 RS wgmma m64nk16 (n = kCols) in bf16x3
//                      (fp32-grade products), A = M split from its fp32 panels into registers,
//                      B = the running slice, kept as S^T bf16 hi/lo panels (ping-pong between two
//                      buffers). Pipelined (correction_m_steps): M and S* arrive by TMA boxes into
//                      128-byte-swizzled panels (StepLoads) about two steps ahead, and the next
//                      step's base and first k-half are split while this step's second k-half runs
//                      (two barriers per step; an M step after a copy reads its start slice
//                      from the copy's source). The copies and M steps go in blocks of kFlagSteps
//                      steps, their apply-M flags read into shared memory first; a block's copies
//                      run while its first M steps' inputs load
//   fused_forward      main pass: every segment from S_j: o and the final state
// Shard phases (inter-GPU CP, p.shard): the state pass also runs the last segment and every
// segment's M_j (the first too, from zero); the maps phase ends with cp_shard_maps (the whole
// shard's E and M, grid (N, Hv, 2 roles x 4 slices)); the finish phase starts at cp_correction,
// which then applies M_0 to h0 as well. The backward's maps phase ends with cp_grad_shard_maps (D,
// the gradient its own d_o sends into the shard's entering state).
// With a window, S*_j differs from the true end state by the dropped part of the entering state,
// scaled by at most e^{decay_threshold} (e^{-10} ~ 4.5e-5 of its norm by default).
#include <cuda_runtime.h>

#include "kernels/sm90/chain_step.cuh"
#include "kernels/sm90/chunk_gates.cuh"
#include "kernels/sm90/elem_types.cuh"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/sequence.cuh"
#include "kernels/sm90/tensor_map.h"
#include "kernels/sm90/timeline.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/warp_mma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace flashgdn::kern {
namespace {

constexpr int kWindowThreads = 256;                                 // 8 warps
constexpr int kWindowTileChunks = kWindowThreads * 4 / kChunk;      // 16 chunks per tile, 4 tokens a thread

// A token's term of the window sum: g_t + log max(1, |1 - beta_t |k_t|^2|) (0 past the segment).
template <typename Elem>
__device__ __forceinline__ float window_term(const ForwardParams& p, int64_t b, int64_t t, int h, int hk) {
  const int64_t gate_at = b * p.g_strides.batch + t * p.g_strides.token + h * p.g_strides.head;
  const float beta = load_beta(p, b, t, h);
  const Elem* k = row_ptr<Elem>(p.k, p.k_strides, b, t, hk);
  float norm2 = 0.f;
#pragma unroll
  for (int vec = 0; vec < kHeadDim / 8; ++vec) {
    const uint4 raw = *reinterpret_cast<const uint4*>(k + 8 * vec);
    const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) norm2 += to_float(e[i]) * to_float(e[i]);
  }
  return p.g[gate_at] + window_growth(beta * norm2);
}

// Tiles of 16 chunks: the 32 half-chunk sums of a tile in parallel (warp w sums half-chunks w,
// w + 8, w + 16, w + 24 of 32 tokens each, one token a lane), then thread 0 adds the chunks in
// walking order until the total crosses the threshold. (A chunk's sum is its two halves' warp
// sums added, as one chunk at a time would: the same window.)
template <typename Elem>
__global__ void __launch_bounds__(kWindowThreads) cp_windows_kernel(const ForwardParams p, int32_t* windows,
                                                                    bool leading) {
  wait_for_previous_grid();
  release_next_grid();
  const int64_t x = blockIdx.x;
  const int h = blockIdx.y;
  const SegmentLocation at = locate_segment(p, x);
  if (!at.valid) return;
  int32_t* window = &windows[x * p.num_v_heads + h];
  const int hk = h / (p.num_v_heads / p.num_qk_heads);
  const int64_t b = at.seq.batch;
  const int64_t chunks = (at.eos - at.bos + kChunk - 1) / kChunk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float half_sums[2 * kWindowTileChunks];
  __shared__ int32_t found;  // the window in chunks once crossed, else 0
  float total = 0.f;         // thread 0's running sum
  if (threadIdx.x == 0) found = 0;
  for (int64_t tile0 = 0; tile0 < chunks; tile0 += kWindowTileChunks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int half = warp + 8 * i;
      const int64_t step = tile0 + half / 2;
      float term = 0.f;
      if (step < chunks) {
        const int64_t c = leading ? step : chunks - 1 - step;
        const int64_t t = at.bos + c * kChunk + 32 * (half % 2) + lane;
        if (t < at.eos) term = window_term<Elem>(p, b, t, h, hk);
      }
      term = warp_sum(term);
      if (lane == 0) half_sums[half] = term;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int j = 0; j < kWindowTileChunks && tile0 + j < chunks; ++j) {
        total += half_sums[2 * j] + half_sums[2 * j + 1];
        if (total <= p.decay_threshold) {
          found = static_cast<int32_t>(tile0 + j + 1);
          break;
        }
      }
    }
    __syncthreads();
    if (found != 0) break;
  }
  if (threadIdx.x == 0) *window = found;
}

// The same windows from the chunk inverse's per-chunk sums (p.chunk_window_terms): tiles of 256
// chunks in walking order, thread i holding the tile's chunk i; the running totals by a block-wide
// inclusive scan (warp shuffles, then the 8 warp totals), the first chunk at or below the threshold
// by ballot. (Summed in another order than cp_windows_kernel: they may differ at rounding level.)
__global__ void __launch_bounds__(kWindowThreads) cp_windows_from_chunks_kernel(const ForwardParams p, int32_t* windows,
                                                                               bool leading) {
  wait_for_previous_grid();
  release_next_grid();
  const int64_t x = blockIdx.x;
  const int h = blockIdx.y;
  const SegmentLocation at = locate_segment(p, x);
  if (!at.valid) return;
  const int64_t chunks = (at.eos - at.bos + kChunk - 1) / kChunk;
  const int64_t first_id = first_chunk(p, at.sequence) + (at.bos - at.seq.bos) / kChunk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float warp_totals[kWindowThreads / 32];
  __shared__ int32_t first_crossing;  // the tile's first chunk at or below the threshold; kWindowThreads: none
  float before = 0.f;                 // the earlier tiles' total
  int64_t found = 0;
  for (int64_t tile0 = 0; tile0 < chunks; tile0 += kWindowThreads) {
    const int64_t step = tile0 + threadIdx.x;
    const bool valid = step < chunks;
    float running = warp_inclusive_sum(
        valid ? p.chunk_window_terms[(first_id + (leading ? step : chunks - 1 - step)) * p.num_v_heads + h] : 0.f);
    if (lane == 31) warp_totals[warp] = running;
    if (threadIdx.x == 0) first_crossing = kWindowThreads;
    __syncthreads();
    float tile_total = 0.f;
#pragma unroll
    for (int w = 0; w < kWindowThreads / 32; ++w) {
      if (w < warp) running += warp_totals[w];
      tile_total += warp_totals[w];
    }
    const unsigned crossed = __ballot_sync(0xffffffffu, valid && before + running <= p.decay_threshold);
    if (lane == 0 && crossed != 0u) atomicMin(&first_crossing, 32 * warp + __ffs(crossed) - 1);
    __syncthreads();
    if (first_crossing < kWindowThreads) {
      found = tile0 + first_crossing + 1;
      break;
    }
    before += tile_total;
    __syncthreads();  // warp_totals and first_crossing are rewritten by the next tile
  }
  if (threadIdx.x == 0) windows[x * p.num_v_heads + h] = static_cast<int32_t>(found);
}

using namespace chain;  // the step (chain_step.cuh)
constexpr int kCorrectionThreads = kChainThreads;
// State columns per chain CTA: the corrections take 16 (8 CTAs a state, half the B operand's
// shared-memory reads a step) where that still fits one wave, else 32; the shard maps and rank
// scans take 32.
constexpr int kShardSliceCols = 32;

constexpr int kFlagSteps = 4096;  // the corrections' steps whose apply-M flags are in shared memory at once

// Two buffers: step j's M and base slice (S* or dS*) in one while step j + 1's arrive in the other,
// each as [128 rows][32] fp32 panels in the TMA's 128-byte swizzle (panel_element); kCols: the
// running slice's width.
template <int kCols>
struct CorrectionStorage {
  alignas(1024) unsigned char m[2][kHeadDim / kPanelCols][kPanelBytes];  // M's column panels
  alignas(1024) unsigned char base[2][kPanelBytes];                      // the base slice
  // The running slice, ping-pong: step t reads s[t ^ 1] and writes s[t].
  SliceBuffer<kCols> s[2];
  // cp_correction, cp_grad_correction: whether each step of a block of kFlagSteps applies M (read
  // from the window tables once, all loads in flight, instead of one dependent load per test).
  alignas(16) uint8_t apply_m[kFlagSteps];  // 0 past the block's last step
  alignas(8) uint64_t loaded[2];  // buffer b's step inputs landed (StepLoads)
};
static_assert(sizeof(CorrectionStorage<32>) <= 232448, "above the 227 KiB of shared memory a block may opt in to");

// The step inputs' sources: a 2-D map over a workspace of [128][128] fp32 blocks (rows = blocks x 128,
// 128 columns), boxes of one panel ([128 rows][32 columns], 128-byte swizzle). Block -1: none.
struct StepMaps {
  CUtensorMap base, m;  // the base slice's workspace, M's
};
struct StepBlocks {
  int64_t base = -1, m = -1;  // the step's blocks in them (-1: zeros for the base, no M)
};

// A correction step's inputs into buffer `buf`: the base slice (columns col0 .. col0 + 31 of its
// block, zero past column 127; zeros without one) and M (4 panels) when the step applies it, by TMA boxes on mbarrier
// loaded[buf] (thread 0). (16-byte cp.async from every thread kept ~8 KiB in flight per SM, ~3 us for a
// step's 80 KiB; 256 row-sized bulk copies were slower still.) Called by every thread (zeros are
// plain stores, ordered by the caller's barrier); each call is waited for once by StepLoads::wait.
template <typename Storage>
__device__ __forceinline__ void load_correction_step(Storage& smem, const StepMaps& maps, int buf, StepBlocks blocks,
                                                     int col0) {
  if (threadIdx.x == 0) {
    uint64_t* barrier = &smem.loaded[buf];
    tma::arrive_expect_bytes(barrier, (blocks.base >= 0 ? kPanelBytes : 0) + (blocks.m >= 0 ? kHeadDim * kHeadDim * 4 : 0));
    if (blocks.base >= 0) tma::load_2d(smem.base[buf], &maps.base, barrier, col0, static_cast<int>(blocks.base * kHeadDim));
    if (blocks.m >= 0) {
#pragma unroll
      for (int panel = 0; panel < kHeadDim / kPanelCols; ++panel)
        tma::load_2d(smem.m[buf][panel], &maps.m, barrier, panel * kPanelCols, static_cast<int>(blocks.m * kHeadDim));
    }
  }
  if (blocks.base < 0) {
    for (int e = threadIdx.x; e < kPanelBytes / 16; e += kCorrectionThreads)
      reinterpret_cast<float4*>(smem.base[buf])[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The two buffers' load phases: init() by every thread at the kernel's start (thread 0 sets the
// mbarriers up and prefetches the maps, then a barrier); wait(buf) blocks until buffer buf's latest
// load_correction_step has landed (each load waited for exactly once, in issue order per buffer).
struct StepLoads {
  uint32_t phases = 0;  // bit b: the parity of buffer b's next load
  template <typename Storage>
  __device__ __forceinline__ void init(Storage& smem, const StepMaps& maps) {
    if (threadIdx.x == 0) {
      tma::barrier_init(&smem.loaded[0], 1);
      tma::barrier_init(&smem.loaded[1], 1);
      tma::fence_barrier_init();
      tma::prefetch_map(&maps.base);
      tma::prefetch_map(&maps.m);
    }
    __syncthreads();
  }
  template <typename Storage>
  __device__ __forceinline__ void wait(Storage& smem, int buf) {
    tma::wait(&smem.loaded[buf], (phases >> buf) & 1u);
    phases ^= 1u << buf;
  }
};

// One serial step of a chain, of parity t (buffers alternate between steps), operands loaded and
// waited for in place: next = base + (apply_m ? M S : 0) from buffer t with S in smem.s[t ^ 1]; next
// goes to smem.s[t] and to `out`. No barrier inside: the caller's one barrier per step orders step
// t's reads of s[t ^ 1] and of buffer t before step t + 1 writes s[t ^ 1] and step t + 2's loads
// refill buffer t. (The corrections pipeline these phases instead: operands of the next step while
// this one's wgmmas run.)
template <bool kTransposed, int kCols>
__device__ __forceinline__ void correction_step(CorrectionStorage<kCols>& smem, int t, bool apply_m, float* out,
                                                int col0) {
  float acc[kCols / 2];
  load_step_base<kCols, kTransposed>(smem.base[t], acc);
  if (apply_m) {
    HalfA a[2];
    load_step_a<kTransposed>(smem.m[t], 0, a[0]);
    load_step_a<kTransposed>(smem.m[t], 1, a[1]);
    issue_step_half(acc, a[0], 0, smem.s[t ^ 1]);
    issue_step_half(acc, a[1], 1, smem.s[t ^ 1]);
    wg::wait<0>();
    wg::fence_operand(acc);
  }
  store_step<kTransposed>(acc, &smem.s[t], out, col0);
}

// segment_state's block as a plain pointer ([128][128] fp32, rows of 128).
__device__ __forceinline__ float* segment_block(float* buffer, int num_v_heads, int64_t segment, int h) {
  return static_cast<float*>(segment_state(buffer, num_v_heads, segment, h).base);
}

// segment_block(buffer, num_v_heads, first + j, h) for the steps j of one correction (segment
// indices of one sequence: j < 2^31): the first block and the 32-bit stride between segments, so
// that a step's block is one wide multiply-add (re-formed from the 64-bit segment index, a block
// took ~10 uniform operations, several a step).
struct SegmentBlocks {
  float* first;
  uint32_t stride;  // floats from one segment's block to the next: num_v_heads x 128 x 128
  __device__ __forceinline__ float* operator()(int64_t j) const {  // j >= 0
    return first + static_cast<uint64_t>(static_cast<uint32_t>(j)) * stride;
  }
};
__device__ __forceinline__ SegmentBlocks segment_blocks(float* buffer, int num_v_heads, int64_t first, int h) {
  return {segment_block(buffer, num_v_heads, first, h), static_cast<uint32_t>(num_v_heads) * kHeadDim * kHeadDim};
}

// The (sequence, v-head, column slice) of a correction CTA and its sequence's segments (the count
// clamped to the workspace: a device cu_seqlens that disagrees with the host copy must not write
// past it).
struct CorrectionSlice {
  int64_t sequence, first, count;
  int head, col0;
};
template <int kCols>
__device__ __forceinline__ CorrectionSlice correction_slice(const ForwardParams& p, int slice) {
  CorrectionSlice at;
  at.sequence = blockIdx.x;
  at.head = blockIdx.y;
  at.col0 = kCols * slice;
  at.first = first_segment(p, at.sequence);
  at.count = min(p.cu_seqlens == nullptr ? segments_per_batch_entry(p) : p.segment_offsets[at.sequence + 1] - at.first,
                 p.max_segments - at.first);
  return at;
}

// Columns col0 .. col0 + kCols - 1 of a state in registers (StateSlice): fetch_state_slice reads `from`
// (zeros when absent), store_state_slice writes them to `to`, any layouts, every load issued before
// any store. Thread layout (at; copy_slices' too): row e / (kCols / 4), 4 columns from
// 4 (e % (kCols / 4)), e = tid + 256 u, so that a 16-byte-aligned fp32 block with unit column stride
// (the workspace's) takes 16-byte stores, kCols / 4 threads a row (a row a thread in 16 scalar
// stores cost ~6k cycles of the correction's start).
template <int kCols>
struct StateSlice {
  static constexpr int kVecs = kHeadDim * kCols / 4 / kCorrectionThreads;  // 4 (2) float4 a thread
  float4 x[kVecs];
  static __device__ __forceinline__ int2 at(int u, int col0) {
    const int e = threadIdx.x + kCorrectionThreads * u;
    return make_int2(e / (kCols / 4), col0 + 4 * (e % (kCols / 4)));
  }
};
// Steps that apply no M copy S*: `to(j)` = `from(j)` (column slice col0) for every step j in
// [begin, end) whose apply-M flag (apply_m[j - begin], load_step_flags) is 0, independent of each
// other, so all at once: four steps' float4s in flight per thread. Four steps' flags are read as one
// word, and a group of four M steps is passed over at once (a flag test per step cost ~190 cycles
// of a CTA whose steps all apply M).
template <int kCols, typename From, typename To>
__device__ __forceinline__ void copy_slices(const uint8_t* apply_m, int64_t begin, int64_t end, From&& from, To&& to,
                                            int col0) {
  constexpr int kSteps = 4, kVecs = StateSlice<kCols>::kVecs;  // StateSlice's thread layout
  constexpr uint32_t kAllApplyM = 0x01010101u;
  for (int64_t j0 = begin; j0 < end; j0 += kSteps) {
    const uint32_t flags = *reinterpret_cast<const uint32_t*>(apply_m + (j0 - begin));  // 0 past end
    if (flags == kAllApplyM) continue;
    const auto copy = [&](int i) { return j0 + i < end && ((flags >> (8 * i)) & 0xffu) == 0; };
    float4 v[kSteps][kVecs];
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (!copy(i)) continue;
      const float* src = from(j0 + i);
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int2 rc = StateSlice<kCols>::at(u, col0);
        v[i][u] = *reinterpret_cast<const float4*>(src + rc.x * kHeadDim + rc.y);
      }
    }
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (!copy(i)) continue;
      float* dst = to(j0 + i);
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {  // st.global.v4: NVVM stored these float4s word by word
        const int2 rc = StateSlice<kCols>::at(u, col0);
        store_global_16(dst + rc.x * kHeadDim + rc.y, __float_as_uint(v[i][u].x), __float_as_uint(v[i][u].y),
                        __float_as_uint(v[i][u].z), __float_as_uint(v[i][u].w));
      }
    }
  }
}

template <int kCols>
__device__ __forceinline__ StateSlice<kCols> fetch_state_slice(const StateBlock& from, int col0) {
  StateSlice<kCols> slice;
#pragma unroll
  for (int u = 0; u < StateSlice<kCols>::kVecs; ++u) {
    const int2 rc = StateSlice<kCols>::at(u, col0);
    slice.x[u] = from.base == nullptr ? make_float4(0.f, 0.f, 0.f, 0.f)
                                      : make_float4(from.load(rc.x, rc.y), from.load(rc.x, rc.y + 1),
                                                    from.load(rc.x, rc.y + 2), from.load(rc.x, rc.y + 3));
  }
  return slice;
}
template <int kCols>
__device__ __forceinline__ void store_state_slice(const StateSlice<kCols>& slice, const StateBlock& to, int col0) {
  const bool vectors = !to.bf16 && to.v_stride == 1 && to.k_stride % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(to.base) % 16 == 0;
#pragma unroll
  for (int u = 0; u < StateSlice<kCols>::kVecs; ++u) {
    const int2 rc = StateSlice<kCols>::at(u, col0);
    const float4 x = slice.x[u];
    if (vectors) {
      *reinterpret_cast<float4*>(static_cast<float*>(to.base) + rc.x * to.k_stride + rc.y) = x;
    } else {
      to.store(rc.x, rc.y, x.x), to.store(rc.x, rc.y + 1, x.y);
      to.store(rc.x, rc.y + 2, x.z), to.store(rc.x, rc.y + 3, x.w);
    }
  }
}

// A [128, kCols] column slice of a [128][128] fp32 workspace state on its way into a running slice
// buffer: fetch_slice issues the plain loads (a null state: nothing), put_slice splits the values
// into the buffer and makes the writes visible to wgmma (the caller's barrier orders them before
// the step that reads them), so that other work can run while the loads are in flight.
template <int kCols>
struct FetchedSlice {
  static constexpr int kPairs = kCols / 2, kRowStep = kCorrectionThreads / kPairs;
  float2 x[kHeadDim / kRowStep];
  bool present;
  static __device__ __forceinline__ int row() { return threadIdx.x / kPairs; }
  static __device__ __forceinline__ int col() { return 2 * (threadIdx.x % kPairs); }
};
template <int kCols>
__device__ __forceinline__ FetchedSlice<kCols> fetch_slice(const float* state, int col0) {
  using F = FetchedSlice<kCols>;
  F f;
  f.present = state != nullptr;
#pragma unroll
  for (int i = 0; i < kHeadDim / F::kRowStep; ++i)
    f.x[i] = f.present ? *reinterpret_cast<const float2*>(state + (F::row() + i * F::kRowStep) * kHeadDim + col0 + F::col())
                       : make_float2(0.f, 0.f);
  return f;
}
template <bool kTransposed, int kCols>
__device__ __forceinline__ void put_slice(SliceBuffer<kCols>& slice, const FetchedSlice<kCols>& f) {
  using F = FetchedSlice<kCols>;
  if (!f.present) return;
#pragma unroll
  for (int i = 0; i < kHeadDim / F::kRowStep; ++i) {
    slice.template store<kTransposed>(F::row() + i * F::kRowStep, F::col(), f.x[i].x);
    slice.template store<kTransposed>(F::row() + i * F::kRowStep, F::col() + 1, f.x[i].y);
  }
  wg::fence_shared_to_async();
}

// The apply-M flags of steps [begin, end) (at most kFlagSteps) into flags[j - begin]: every thread
// tests kFlagSteps / kCorrectionThreads steps with its loads in flight together. Barriers before (the
// previous block's readers are done) and after. Returns whether any step of the block is a copy (no
// M): when none is, the caller skips copy_slices (its flag-word loop cost ~3k cycles of cold code).
template <typename ApplyM>
__device__ __forceinline__ bool load_step_flags(uint8_t* flags, int64_t begin, int64_t end, ApplyM&& apply_m) {
  constexpr int kPerThread = kFlagSteps / kCorrectionThreads;
  __syncthreads();
  bool m[kPerThread];
  bool copies = false;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t j = begin + threadIdx.x + kCorrectionThreads * i;
    m[i] = j < end && apply_m(j);
    copies |= j < end && !m[i];
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) flags[threadIdx.x + kCorrectionThreads * i] = m[i];
  return __syncthreads_or(copies) != 0;
}

// The M steps of a correction's flag block, serial, pipelined. Step j's TMA inputs were issued about
// two steps ahead; its base and A's k-half 0 were split into registers while the previous step's
// k-half 1 ran. A step: acc = base, k-half 0's wgmmas issued; k-half 1 split from its buffer; a
// barrier (the buffer is read everywhere: thread 0 refills it with the inputs of the step after next);
// k-half 1 issued; wg::wait<1> (k-half 0's registers free); the next step's inputs waited for, its
// base and k-half 0 split; wg::wait<0>; the result stored. The steps from j on: after(j) the next M
// step, valid(j) whether there is one, load(j, buf) issues step j's inputs into buffer buf,
// start_of(j) the [128][128] fp32 block holding step j's start when the previous M step is not its
// neighbour (consecutive(j, after(j)); null: already in the running slice), out(j) where step j's
// result goes; mark(j, event) the timeline's step events (0 top, 2 barrier passed, 4 k-half 0
// issued, 7 buffer released, 1 next inputs waited, 6 next operands split, 5 wgmmas waited, 3
// stored). prologue(): the block's other work (the copies), run while the first two steps' TMA
// inputs and the first start's loads are in flight (so no start may be read from a block the
// prologue writes: start_of names the copy's source instead). t: the parity of the next step
// (buffers and slices alternate). A barrier before any shared-memory use (the copies' writes and
// earlier steps' reads are done); every load issued is waited for. Every step has a base block
// (load's zero-filled base, plain stores, would need a barrier before the prologue reads it).
template <bool kTransposed, int kCols, typename After, typename Valid, typename Consecutive, typename Load,
          typename StartOf, typename Out, typename Mark, typename Prologue>
__device__ __forceinline__ void correction_m_steps(CorrectionStorage<kCols>& smem, StepLoads& loads, int& t, int j,
                                                   int col0, After&& after, Valid&& valid, Consecutive&& consecutive,
                                                   Load&& load, StartOf&& start_of, Out&& out, Mark&& mark,
                                                   Prologue&& prologue) {
  if (!valid(j)) {
    prologue();
    return;
  }
  __syncthreads();
  int j1 = static_cast<int>(after(j));  // step indices are segment indices of one sequence: < 2^31
  load(j, t);
  if (valid(j1)) load(j1, t ^ 1);
  const FetchedSlice<kCols> first_start = fetch_slice<kCols>(start_of(j), col0);
  prologue();
  put_slice<kTransposed>(smem.s[t ^ 1], first_start);
  float base[kCols / 2];
  HalfA a0, a1;  // k-half 0 (split a step ahead), k-half 1
  // The ping-pong slices' descriptor words: s[u]'s are s[0]'s plus u slice sizes (in 16-byte units).
  SliceWords words0 = slice_words(smem.s[0]);
  asm volatile("" : "+r"(words0.hi), "+r"(words0.lo));
  constexpr uint32_t kSliceWordStep = sizeof(SliceBuffer<kCols>) / 16;
  loads.wait(smem, t);
  load_step_base<kCols, kTransposed>(smem.base[t], base);
  load_step_a<kTransposed>(smem.m[t], 0, a0);
  for (;;) {
    mark(j, 0);
    __syncthreads();  // s[t ^ 1] written (previous step or start_slice)
    mark(j, 2);
    float acc[kCols / 2];
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) acc[e] = base[e];
    const uint32_t s_in_step = static_cast<uint32_t>(t ^ 1) * kSliceWordStep;
    const SliceWords s_in{words0.hi + s_in_step, words0.lo + s_in_step};  // smem.s[t ^ 1]
    issue_step_half<kCols>(acc, a0, 0, s_in);
    mark(j, 4);
    load_step_a<kTransposed>(smem.m[t], 1, a1);
    __syncthreads();  // buffer t read everywhere
    const int j2 = valid(j1) ? static_cast<int>(after(j1)) : j1;
    if (valid(j2)) load(j2, t);
    mark(j, 7);
    issue_step_half<kCols>(acc, a1, 1, s_in);
    wg::wait<1>();  // k-half 0 done: a0 free
    if (valid(j1)) {
      loads.wait(smem, t ^ 1);
      mark(j, 1);
      load_step_base<kCols, kTransposed>(smem.base[t ^ 1], base);
      load_step_a<kTransposed>(smem.m[t ^ 1], 0, a0);
      mark(j, 6);
    }
    wg::wait<0>();
    wg::fence_operand(acc);
    mark(j, 5);
    const bool chained = valid(j1) && consecutive(j, j1);  // the next step starts from this one's slice
    store_step<kTransposed>(acc, chained ? &smem.s[t] : nullptr, out(j), col0);
    mark(j, 3);
    t ^= 1;
    if (!valid(j1)) return;
    // Not chained: the next step's start into the slot this step left unwritten (last read by the
    // previous step's wgmmas, done before this step's first barrier).
    if (!chained) put_slice<kTransposed>(smem.s[t ^ 1], fetch_slice<kCols>(start_of(j1), col0));
    j = j1;
    j1 = j2;
  }
}

template <int kCols>
__global__ void __launch_bounds__(kCorrectionThreads, 1) cp_correction_kernel(const ForwardParams p,
                                                                                 const __grid_constant__ StepMaps maps) {
  // Early start (grid_dependency.cuh): until the first flag block's flags are read the kernel reads
  // only the call's inputs (h0) and tables written two or more kernels back (the segment offsets,
  // window_chunks) and writes S_0 into segment_starts, which the state pass (the previous kernel)
  // neither reads nor writes; so the wait comes after them, before the step inputs and the copies'
  // sources (the state pass's S* and M) are read. In shard mode h0 is the previous kernel's output.
  if (p.shard) wait_for_previous_grid();
  release_next_grid();
  timeline_mark(p, 1, kTimelineCorrectionRow - 1, 10);
  // (forward) S_0 = h0, S_{j+1} = S*_j + [no window] M_j S_j
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  CorrectionStorage<kCols>& smem = *reinterpret_cast<CorrectionStorage<kCols>*>(smem_raw);
  StepLoads loads;
  loads.init(smem, maps);
  timeline_mark(p, 1, kTimelineCorrectionRow - 1, 0);
  // h0's slice is read before the segment offsets resolve (it does not depend on them).
  const StateSlice<kCols> h0 = fetch_state_slice<kCols>(sequence_initial_state(p, blockIdx.x, blockIdx.y),
                                                        kCols * static_cast<int>(blockIdx.z));
  const auto [n, first, count, h, col0] = correction_slice<kCols>(p, blockIdx.z);
  // S_0 = h0 (or zero) into the first segment's start; an empty sequence's final state is h0.
  const StateBlock first_start = count > 0 ? segment_state(p.segment_starts, p.num_v_heads, first, h)
                                           : sequence_final_state(p, n, h);
  if (first_start.base != nullptr) store_state_slice(h0, first_start, col0);
  timeline_mark(p, 1, kTimelineCorrectionRow - 1, 1);
  // Step j (1 <= j < count) writes the start of segment first + j from segment prev = first + j - 1:
  // S*_prev and, without a window (and past the first segment, whose S* already starts from h0,
  // unless p.shard), M_prev.
  auto apply_m = [&](int64_t j) {
    return (j - 1 > 0 || p.shard) && p.window_chunks[(first + j - 1) * p.num_v_heads + h] == 0;
  };
  const SegmentBlocks start_of = segment_blocks(p.segment_starts, p.num_v_heads, first, h);
  const SegmentBlocks ends = segment_blocks(p.segment_ends, p.num_v_heads, first, h);
  auto load_step = [&](int64_t j, int buf) {
    const int64_t prev = (first + j - 1) * p.num_v_heads + h;  // S*_prev and M_prev
    load_correction_step(smem, maps, buf, {prev, prev}, col0);
  };
  int t = 0;
  // The steps in blocks of kFlagSteps, their flags in shared memory.
  for (int64_t begin = 1; begin < count; begin += kFlagSteps) {
    const int64_t end = min(count, begin + kFlagSteps);
    const bool copies = load_step_flags(smem.apply_m, begin, end, apply_m);
    timeline_mark(p, 1, kTimelineCorrectionRow - 1, 2);
    wait_for_previous_grid();  // the state pass's S* and M (returns at once from the second block on)
    auto m_step = [&](int64_t j) { return smem.apply_m[j - begin] != 0; };
    auto copy_source = [&](int64_t j) { return ends(j - 1); };
    // The steps with M, serial (correction_m_steps), and the prologue, while their first inputs
    // load: the steps without M, S_{j+1} = S*_j, all at once. The running slice stays in shared
    // memory where M steps are consecutive; an M step after a copy (or after S_0, or first in its
    // block) takes its start S_{j-1} from global memory: the copy's source S*_{j-2} where step
    // j - 1 is one of this block's copies (the prologue writes S_{j-1} concurrently), else
    // segment_starts.
    auto next_m_step = [&](int64_t j) {
      while (j < end && !m_step(j)) ++j;
      return j;
    };
    correction_m_steps<false>(
        smem, loads, t, next_m_step(begin), col0, [&](int64_t j) { return next_m_step(j + 1); },
        [&](int64_t j) { return j < end; }, [](int64_t j, int64_t next) { return next == j + 1; }, load_step,
        [&](int64_t j) -> const float* { return j - 1 >= begin && !m_step(j - 1) ? copy_source(j - 1) : start_of(j - 1); },
        start_of, [&](int64_t j, int event) { timeline_mark(p, 1, kTimelineCorrectionRow + j, event); },
        [&] {
          if (copies) copy_slices<kCols>(smem.apply_m, begin, end, copy_source, start_of, col0);
          timeline_mark(p, 1, kTimelineCorrectionRow - 1, 11);
        });
  }
  wait_for_previous_grid();  // a sequence without steps waits too: the stream's order stays transitive
}

// (shard maps) role 0: S_0 = 0, S_{j+1} = S*_j + [no window] M_j S_j over all J segments, so S_J
// = E; role 1: S_0 = I, S_{j+1} = [no window] M_j S_j, so S_J = M_{J-1} ... M_0 = M (zero once a
// segment has a window: the shard forgets its entering state). Both into p.shard_maps; an empty
// sequence's maps are S_0. Same thread layout, prefetching and barrier per step as the forward
// correction, with the step's output written straight to the map (the last write is S_J).
__global__ void __launch_bounds__(kCorrectionThreads) cp_shard_maps_kernel(const ForwardParams p,
                                                                              const __grid_constant__ StepMaps maps) {
  wait_for_previous_grid();
  release_next_grid();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  CorrectionStorage<kShardSliceCols>& smem = *reinterpret_cast<CorrectionStorage<kShardSliceCols>*>(smem_raw);
  StepLoads loads;
  loads.init(smem, maps);
  constexpr int kSlices = kHeadDim / kShardSliceCols;
  const int role = static_cast<int>(blockIdx.z) / kSlices;
  const auto [n, first, count, h, col0] = correction_slice<kShardSliceCols>(p, static_cast<int>(blockIdx.z) % kSlices);
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  float* map = p.shard_maps + ((role * p.num_seqs + n) * p.num_v_heads + h) * (kHeadDim * kHeadDim);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float start = role == 1 && k == col0 + c0 + i ? 1.f : 0.f;
    smem.s[1].store(k, c0 + i, start);  // read by step 0
    if (count <= 0) map[k * kHeadDim + col0 + c0 + i] = start;
  }
  wg::fence_shared_to_async();
  // Step j (0 <= j < count) reads segment first + j: S*_j (role 0) and, without a window, M_j
  // (not for role 0's first step, which multiplies zero).
  auto apply_m = [&](int64_t j) {
    return (role == 1 || j > 0) && p.window_chunks[(first + j) * p.num_v_heads + h] == 0;
  };
  auto load_step = [&](int64_t j, int buf) {
    const int64_t block = (first + j) * p.num_v_heads + h;  // S*_j (role 0) and M_j
    load_correction_step(smem, maps, buf, {role == 0 ? block : -1, apply_m(j) ? block : -1}, col0);
  };
  if (count > 0) load_step(0, 0);
  for (int64_t j = 0; j < count; ++j) {
    const int t = static_cast<int>(j & 1);
    loads.wait(smem, t);  // step j's inputs
    __syncthreads();     // ... visible everywhere, with step j - 1's slice; step j - 1 is done everywhere
    if (j + 1 < count) load_step(j + 1, t ^ 1);
    correction_step<false>(smem, t, apply_m(j), map, col0);
  }
}

// (backward) dS_J = dht, dS_j = dS*_j + [no window] M_j^T dS_{j+1} for j = J-1 .. 1, written as the
// gradient leaving segment j - 1: segment_grad_ends[j - 1]; an empty sequence's dh0 = dht. As the
// forward: the copies (window) all at once while the first M steps' inputs load, then the M steps,
// prefetched where consecutive.
template <int kCols>
__global__ void __launch_bounds__(kCorrectionThreads, 1) cp_grad_correction_kernel(const BackwardParams bp,
                                                                                      const __grid_constant__ StepMaps maps) {
  // Early start as cp_correction's: dht (the call's input) and the flags (the segment offsets,
  // grad_window_chunks: two or more kernels back) before the wait, nothing written to global memory
  // before it; the dS* pass (the previous kernel) writes the steps' inputs and the copies' sources.
  // In shard mode dht is the previous kernel's output.
  if (bp.fwd.shard) wait_for_previous_grid();
  release_next_grid();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  CorrectionStorage<kCols>& smem = *reinterpret_cast<CorrectionStorage<kCols>*>(smem_raw);
  StepLoads loads;
  loads.init(smem, maps);
  const ForwardParams& p = bp.fwd;
  const auto [n, first, count, h, col0] = correction_slice<kCols>(p, blockIdx.z);
  const StateBlock dht = user_state(bp.d_final_state, bp.d_final_state_strides, p.state_vk, n, h);
  const StateSlice<kCols> dht_slice = fetch_state_slice<kCols>(dht, col0);
  if (count <= 0) {  // an empty sequence has no segment to write dh0: it is dht
    wait_for_previous_grid();
    const StateBlock dh0 = user_state(bp.d_initial_state, bp.d_initial_state_strides, p.state_vk, n, h);
    if (dh0.base != nullptr) store_state_slice(dht_slice, dh0, col0);
    return;
  }
#pragma unroll
  for (int u = 0; u < StateSlice<kCols>::kVecs; ++u) {
    const int2 rc = StateSlice<kCols>::at(u, 0);
    const float4 x = dht_slice.x[u];
    smem.s[1].template store<true>(rc.x, rc.y, x.x), smem.s[1].template store<true>(rc.x, rc.y + 1, x.y);
    smem.s[1].template store<true>(rc.x, rc.y + 2, x.z), smem.s[1].template store<true>(rc.x, rc.y + 3, x.w);
  }
  wg::fence_shared_to_async();
  // Step j (count - 1 >= j >= 1) writes the gradient leaving segment first + j - 1 from segment
  // x = first + j: dS*_x and, without a (backward) window, M_x (for the last segment only when dht
  // flows into it).
  auto apply_m = [&](int64_t j) {
    return p.grad_window_chunks[(first + j) * p.num_v_heads + h] == 0 && (j < count - 1 || dht.base != nullptr);
  };
  const SegmentBlocks grad_end_of = segment_blocks(bp.segment_grad_ends, p.num_v_heads, first, h);
  const SegmentBlocks grad_starts = segment_blocks(bp.segment_grad_starts, p.num_v_heads, first, h);
  auto load_step = [&](int64_t j, int buf) {
    const int64_t block = (first + j) * p.num_v_heads + h;  // dS*_j and M_j
    load_correction_step(smem, maps, buf, {block, block}, col0);
  };
  int t = 0;
  // The steps in blocks of kFlagSteps from the last, their flags in shared memory.
  for (int64_t end = count; end > 1; end -= kFlagSteps) {
    const int64_t begin = end > kFlagSteps + 1 ? end - kFlagSteps : 1;
    const bool copies = load_step_flags(smem.apply_m, begin, end, apply_m);
    wait_for_previous_grid();  // the dS* pass's dS* and the transitions (at once from the second block on)
    auto m_step = [&](int64_t j) { return smem.apply_m[j - begin] != 0; };
    auto copy_source = [&](int64_t j) { return grad_starts(j); };
    // The steps with M, serial (as in cp_correction, in reverse), and the prologue, while their first
    // inputs load: the steps without M, dS_j = dS*_j, all at once. An M step j after a copy (or last
    // in its block) takes its start, the gradient leaving segment first + j, from global memory: the
    // copy's source dS*_{j+1} where step j + 1 is one of this block's copies, else segment_grad_ends;
    // the last step's start is dht, in s[1] (t = 0 there: no step before it).
    auto previous_m_step = [&](int64_t j) {
      while (j >= begin && !m_step(j)) --j;
      return j;
    };
    correction_m_steps<true>(
        smem, loads, t, previous_m_step(end - 1), col0, [&](int64_t j) { return previous_m_step(j - 1); },
        [&](int64_t j) { return j >= begin; }, [](int64_t j, int64_t next) { return next == j - 1; }, load_step,
        [&](int64_t j) -> const float* {
          if (j == count - 1) return nullptr;  // dht, already in s[1]
          return j + 1 < end && !m_step(j + 1) ? copy_source(j + 1) : grad_end_of(j);
        },
        [&](int64_t j) { return grad_end_of(j - 1); }, [](int64_t, int) {},
        [&] {
          if (copies)
            copy_slices<kCols>(smem.apply_m, begin, end, copy_source, [&](int64_t j) { return grad_end_of(j - 1); },
                               col0);
        });
  }
  wait_for_previous_grid();  // a sequence without steps waits too: the stream's order stays transitive
}

// (backward shard map) dS_J = 0, dS_j = dS*_j + [no window] M_j^T dS_{j+1} for j = J-1 .. 0; D = dS_0
// into bp.shard_grad (an empty sequence's D is zero). Same layout, prefetching and barrier per step.
__global__ void __launch_bounds__(kCorrectionThreads) cp_grad_shard_maps_kernel(const BackwardParams bp,
                                                                                   const __grid_constant__ StepMaps maps) {
  wait_for_previous_grid();
  release_next_grid();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  CorrectionStorage<kShardSliceCols>& smem = *reinterpret_cast<CorrectionStorage<kShardSliceCols>*>(smem_raw);
  StepLoads loads;
  loads.init(smem, maps);
  const ForwardParams& p = bp.fwd;
  const auto [n, first, count, h, col0] = correction_slice<kShardSliceCols>(p, blockIdx.z);
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  float* map = bp.shard_grad + (n * p.num_v_heads + h) * (kHeadDim * kHeadDim);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    smem.s[1].store<true>(k, c0 + i, 0.f);  // dS_J, read by the first step
    if (count <= 0) map[k * kHeadDim + col0 + c0 + i] = 0.f;
  }
  wg::fence_shared_to_async();
  // Step i (0 <= i < count) reads segment x = first + count - 1 - i: dS*_x and, without a window
  // and past the first step (which multiplies zero), M_x.
  auto segment = [&](int64_t i) { return first + count - 1 - i; };
  auto apply_m = [&](int64_t i) { return i > 0 && p.grad_window_chunks[segment(i) * p.num_v_heads + h] == 0; };
  auto load_step = [&](int64_t i, int buf) {
    const int64_t block = segment(i) * p.num_v_heads + h;  // dS*_x and M_x
    load_correction_step(smem, maps, buf, {block, apply_m(i) ? block : -1}, col0);
  };
  if (count > 0) load_step(0, 0);
  for (int64_t i = 0; i < count; ++i) {
    const int t = static_cast<int>(i & 1);
    loads.wait(smem, t);
    __syncthreads();
    if (i + 1 < count) load_step(i + 1, t ^ 1);
    correction_step<true>(smem, t, apply_m(i), map, col0);
  }
}

// (ranks) S_0 = h0, S_{j+1} = E_j + M_j S_j over the gathered maps of every rank; S_rank ->
// entering (a plain [128][128] block), S_world -> final_state (user layout and dtype, from the last
// slice in shared memory). Same layout, prefetching and barrier per step as the corrections.
__global__ void __launch_bounds__(kCorrectionThreads) shard_scan_kernel(const ShardScanParams a,
                                                                           const __grid_constant__ StepMaps maps) {
  wait_for_previous_grid();
  release_next_grid();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  CorrectionStorage<kShardSliceCols>& smem = *reinterpret_cast<CorrectionStorage<kShardSliceCols>*>(smem_raw);
  StepLoads loads;
  loads.init(smem, maps);
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y, col0 = kShardSliceCols * static_cast<int>(blockIdx.z);
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  constexpr int64_t kBlock = kHeadDim * kHeadDim;
  float* entering = a.entering + (n * a.num_v_heads + h) * kBlock;
  const StateBlock h0 = user_state(a.initial_state, a.initial_state_strides, a.state_vk, n, h, a.initial_state_bf16);
  float x[16];
  h0.load_row(k, col0 + c0, x);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    smem.s[1].store(k, c0 + i, x[i]);  // S_0, read by step 0
    if (a.rank == 0) entering[k * kHeadDim + col0 + c0 + i] = x[i];
  }
  wg::fence_shared_to_async();
  auto load_step = [&](int j, int buf) {  // E_j and M_j, blocks of a.maps
    const int64_t block = (static_cast<int64_t>(j) * 2 * a.num_seqs + n) * a.num_v_heads + h;
    load_correction_step(smem, maps, buf, {block, block + a.num_seqs * a.num_v_heads}, col0);
  };
  if (a.world > 0) load_step(0, 0);
  for (int j = 0; j < a.world; ++j) {
    const int t = j & 1;
    loads.wait(smem, t);
    __syncthreads();
    if (j + 1 < a.world) load_step(j + 1, t ^ 1);
    correction_step<false>(smem, t, true, j + 1 == a.rank ? entering : nullptr, col0);  // S_{j+1} -> s[t]
  }
  __syncthreads();  // S_world, in s[(world - 1) & 1] (s[1] = S_0 when world == 0), complete
  const StateBlock final_state = user_state(a.final_state, a.final_state_strides, a.state_vk, n, h, a.final_state_bf16);
  if (final_state.base != nullptr) {
    const SliceBuffer<kShardSliceCols>& last = smem.s[a.world > 0 ? (a.world - 1) & 1 : 1];
#pragma unroll
    for (int i = 0; i < 16; ++i) final_state.store(k, col0 + c0 + i, last.value(k, c0 + i));  // within 2^-17
  }
}

// (ranks, reverse) dS_world = dht, dS_j = D_j + M_j^T dS_{j+1} for j = world-1 .. rank+1 -> d_out
// (dht itself when this rank holds the last slice). Same layout and protocol as the corrections.
__global__ void __launch_bounds__(kCorrectionThreads) shard_grad_scan_kernel(const ShardGradScanParams a,
                                                                                const __grid_constant__ StepMaps maps) {
  wait_for_previous_grid();
  release_next_grid();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  CorrectionStorage<kShardSliceCols>& smem = *reinterpret_cast<CorrectionStorage<kShardSliceCols>*>(smem_raw);
  StepLoads loads;
  loads.init(smem, maps);
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y, col0 = kShardSliceCols * static_cast<int>(blockIdx.z);
  const int k = threadIdx.x / 2, c0 = 16 * (threadIdx.x % 2);
  constexpr int64_t kBlock = kHeadDim * kHeadDim;
  const int steps = a.world - 1 - a.rank;
  float* d_out = a.d_out + (n * a.num_v_heads + h) * kBlock;
  const StateBlock dht = user_state(a.d_final_state, a.d_final_state_strides, a.state_vk, n, h);
  float x[16];
  dht.load_row(k, col0 + c0, x);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    smem.s[1].store<true>(k, c0 + i, x[i]);  // read by step 0
    if (steps == 0) d_out[k * kHeadDim + col0 + c0 + i] = x[i];
  }
  wg::fence_shared_to_async();
  // Step i reads rank j = world - 1 - i: D_j and M_j (rows N + n of its maps).
  auto load_step = [&](int i, int buf) {  // D_j (a block of a.reaching) and M_j (of a.maps)
    const int64_t j = a.world - 1 - i;
    load_correction_step(smem, maps, buf, {(j * a.num_seqs + n) * a.num_v_heads + h,
                                           (j * 2 * a.num_seqs + a.num_seqs + n) * a.num_v_heads + h}, col0);
  };
  if (steps > 0) load_step(0, 0);
  for (int i = 0; i < steps; ++i) {
    const int t = i & 1;
    loads.wait(smem, t);
    __syncthreads();
    if (i + 1 < steps) load_step(i + 1, t ^ 1);
    correction_step<true>(smem, t, true, i + 1 == steps ? d_out : nullptr, col0);
  }
}

__global__ void state_store_kernel(const float* src, float* states, const int64_t s0, const int64_t s1,
                                   const int64_t s2, const int64_t s3, bool vk) {
  wait_for_previous_grid();
  release_next_grid();
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const float* from = src == nullptr ? nullptr : src + (n * gridDim.y + h) * (kHeadDim * kHeadDim);
  float* to = states + n * s0 + h * s1;
  for (int e = threadIdx.x; e < kHeadDim * kHeadDim; e += blockDim.x) {
    const int row = e / kHeadDim, col = e % kHeadDim;  // (k, v)
    to[vk ? col * s2 + row * s3 : row * s2 + col * s3] = from == nullptr ? 0.f : from[e];
  }
}

// A step map over `blocks` [128][128] fp32 blocks at `base` (tensor_map.h); zeros (never used: no
// step reads it) without any.
cudaError_t step_map(CUtensorMap* map, const float* base, int64_t blocks) {
  *map = CUtensorMap{};
  if (base == nullptr || blocks <= 0) return cudaSuccess;
  if (blocks > INT32_MAX / kHeadDim) return cudaErrorInvalidValue;  // TMA row coordinates are int32
  return encode_block_map(map, base, static_cast<uint64_t>(blocks), kPanelCols) == CUDA_SUCCESS ? cudaSuccess
                                                                                              : cudaErrorInvalidValue;
}

// A serial chain per (sequence, v-head) over segments or ranks (the corrections, the shard maps,
// the rank scans): grid (N, Hv, roles x 128 / kCols column slices), 256 threads, CorrectionStorage in
// dynamic shared memory; its step inputs from `base` (blocks_base of them) and `m` (blocks_m).
template <int kCols = kShardSliceCols, typename Params>
cudaError_t launch_segment_chain(void (*kernel)(Params, StepMaps), const Params& params, const float* base,
                                 int64_t blocks_base, const float* m, int64_t blocks_m, int64_t num_seqs,
                                 int num_v_heads, int roles, cudaStream_t stream) {
  if (num_seqs == 0 || num_v_heads == 0) return cudaSuccess;
  StepMaps maps;
  if (auto err = step_map(&maps.base, base, blocks_base); err != cudaSuccess) return err;
  if (auto err = step_map(&maps.m, m, blocks_m); err != cudaSuccess) return err;
  constexpr int smem = sizeof(CorrectionStorage<kCols>);
  if (auto err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); err != cudaSuccess)
    return err;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(num_seqs), num_v_heads, roles * kHeadDim / kCols),
                       kCorrectionThreads, smem, stream, params, maps);
}

}  // namespace

cudaError_t launch_cp_grad_shard_maps(const BackwardParams& bp, cudaStream_t stream) {
  const int64_t blocks = bp.fwd.max_segments * bp.fwd.num_v_heads;
  return launch_segment_chain(cp_grad_shard_maps_kernel, bp, bp.segment_grad_starts, blocks, bp.fwd.segment_transitions,
                              blocks, bp.fwd.num_seqs, bp.fwd.num_v_heads, 1, stream);
}

cudaError_t launch_cp_grad_correction(const BackwardParams& bp, int slice_cols, cudaStream_t stream) {
  const int64_t blocks = bp.fwd.max_segments * bp.fwd.num_v_heads;
  if (slice_cols == 16)
    return launch_segment_chain<16>(cp_grad_correction_kernel<16>, bp, bp.segment_grad_starts, blocks,
                                    bp.fwd.segment_transitions, blocks, bp.fwd.num_seqs, bp.fwd.num_v_heads, 1, stream);
  if (slice_cols == 32)
    return launch_segment_chain<32>(cp_grad_correction_kernel<32>, bp, bp.segment_grad_starts, blocks,
                                    bp.fwd.segment_transitions, blocks, bp.fwd.num_seqs, bp.fwd.num_v_heads, 1, stream);
  return cudaErrorInvalidValue;
}

template <ElemKind E>
cudaError_t launch_cp_windows(const ForwardParams& p, int32_t* windows, bool leading, cudaStream_t stream) {
  if (p.max_segments == 0 || p.num_v_heads == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.max_segments), p.num_v_heads);
  return launch_kernel(p.chunk_window_terms != nullptr ? cp_windows_from_chunks_kernel : cp_windows_kernel<ElemType<E>>,
                       grid, kWindowThreads, 0, stream, p, windows, leading);
}
template cudaError_t launch_cp_windows<ElemKind::kBF16>(const ForwardParams&, int32_t*, bool, cudaStream_t);
template cudaError_t launch_cp_windows<ElemKind::kF16>(const ForwardParams&, int32_t*, bool, cudaStream_t);

cudaError_t launch_cp_shard_maps(const ForwardParams& p, cudaStream_t stream) {
  const int64_t blocks = p.max_segments * p.num_v_heads;
  return launch_segment_chain(cp_shard_maps_kernel, p, p.segment_ends, blocks, p.segment_transitions, blocks,
                              p.num_seqs, p.num_v_heads, 2, stream);  // roles E and M
}

cudaError_t launch_shard_scan(const ShardScanParams& params, cudaStream_t stream) {
  const int64_t blocks = int64_t{params.world} * 2 * params.num_seqs * params.num_v_heads;  // E and M of every rank
  return launch_segment_chain(shard_scan_kernel, params, params.maps, blocks, params.maps, blocks, params.num_seqs,
                              params.num_v_heads, 1, stream);
}

cudaError_t launch_shard_grad_scan(const ShardGradScanParams& params, cudaStream_t stream) {
  const int64_t reaching = int64_t{params.world} * params.num_seqs * params.num_v_heads;
  return launch_segment_chain(shard_grad_scan_kernel, params, params.reaching, reaching, params.maps, 2 * reaching,
                              params.num_seqs, params.num_v_heads, 1, stream);
}

cudaError_t launch_state_store(const float* src, float* states, const int64_t (&strides)[4], bool vk,
                               int64_t num_seqs, int num_v_heads, cudaStream_t stream) {
  if (num_seqs == 0 || num_v_heads == 0 || states == nullptr) return cudaSuccess;
  return launch_kernel(state_store_kernel, dim3(static_cast<unsigned>(num_seqs), num_v_heads), 256, 0, stream, src,
                       states, strides[0], strides[1], strides[2], strides[3], vk);
}

cudaError_t launch_cp_correction(const ForwardParams& p, int slice_cols, cudaStream_t stream) {
  const int64_t blocks = p.max_segments * p.num_v_heads;
  if (slice_cols == 16)
    return launch_segment_chain<16>(cp_correction_kernel<16>, p, p.segment_ends, blocks, p.segment_transitions, blocks,
                                    p.num_seqs, p.num_v_heads, 1, stream);
  if (slice_cols == 32)
    return launch_segment_chain<32>(cp_correction_kernel<32>, p, p.segment_ends, blocks, p.segment_transitions, blocks,
                                    p.num_seqs, p.num_v_heads, 1, stream);
  return cudaErrorInvalidValue;
}

}  // namespace flashgdn::kern
