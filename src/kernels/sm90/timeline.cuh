// Debug timeline of the warp-specialized forwards (fused_forward_ws.cuh, fused_forward_rs.cuh), in
// builds configured with -DFLASHGDN_TIMELINE=ON only (elsewhere timeline_mark compiles to nothing):
// thread 0 of the aux warpgroup (role 0) and of state group 0 (role 1) of CTA (0, 0, 0) write
// clock64() at the phase boundaries of chunks 0 .. kTimelineChunks - 1 into ForwardParams::timeline,
// uint64 [2 roles][kTimelineChunks][kTimelineEvents] (unwritten entries keep what the caller put
// there). Events, aux: 0 top, 1 slot free, 2 tiles landed, 3 gates shared, 4 P stored, 5 Ag stored,
// 6 -W~ waited, 7 ready (v5: 3 K K^T, 4 L stored, 5 X formed, 8 / 9 the inverse's diagonal / 16 -> 32
// stages done); state: 0 top, 1 ready seen, 2 Vd (and QS) waited, 3 update issued,
// 4 update waited, 5 chunk done (v5: 7 U^T and QS^T waited, 8 W formed, 9 Ag half stored, 6 Ag's barrier
// passed). v4 and v5, both roles, in chunk 0's row: 10 item start, 11 item end (the last chunk's o and
// the final state stored for the state groups); in chunk 1's row, the item start's steps: aux 10
// lookups and barriers initialised, 11 chunk 0's loads issued; state 11 initial state loaded.
// The backward's gradient pass (backward_grads.cuh) uses the same buffer: thread 0 of warpgroup g
// (role g) of CTA 0 marks its items (row = the CTA's item ordinal): 0 top, 1 load sets waited,
// 2 stage A done (barrier), 3 B done, 4 C's first commit group waited, 5 C done, 6 D done, 7 E's
// wgmmas waited, 8 group_sums' running sum waited, 9 stores issued, 10 item end, 11 (group 1's issuer,
// under E's wgmmas, before their wait) the item after next looked up.
// The forward's CP correction (cp_correction_kernel, cp_kernels.cu) marks CTA (0, 0, 0)'s steps with
// thread 128 (role 1) from row kTimelineCorrectionRow on (row kTimelineCorrectionRow + j for step j,
// above the rows the fused passes' items of at most kTimelineCorrectionRow - 1 chunks write): 0 step
// top, 2 barrier passed, 4 k-half 0 issued, 7 the step's buffer released, 1 the next step's inputs
// waited, 6 its base and k-half 0 split, 5 wgmmas waited, 3 step stored (cp_kernels.cu's
// correction_m_steps); in the row before: 10 kernel start (before the wait for the previous grid
// outside shard mode: the early start), 0 the step barriers initialised, 1 S_0 stored, 2 the first
// flag block read, 11 the M steps' loop entered (the previous grid waited for, the copies done; once
// per flag block).
// bench/timeline.py reads them (--backward for the gradient pass, --correction for the correction).
#pragma once

#include "kernels/sm90/params.h"

namespace flashgdn::kern {

inline constexpr int kTimelineChunks = 128, kTimelineEvents = 12, kTimelineCorrectionRow = 16;

__device__ __forceinline__ void timeline_mark(const ForwardParams& p, int role, int64_t chunk, int event) {
#ifdef FLASHGDN_TIMELINE
  if (p.timeline != nullptr && threadIdx.x == 128u * role && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
      chunk < kTimelineChunks)
    p.timeline[(role * kTimelineChunks + chunk) * kTimelineEvents + event] = clock64();
#else
  (void)p, (void)role, (void)chunk, (void)event;
#endif
}

}  // namespace flashgdn::kern
