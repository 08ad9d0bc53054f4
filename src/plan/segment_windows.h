// Decay windows of every (segment, v-head) of a CP plan (DESIGN §1; the rule is decay_window.h).
//
// Forward: the state entering segment j + 1 of a sequence is S*_j + M_j S_j. When the summed
// log-decay of the last n chunks of segment j is <= threshold, the state entering those chunks
// contributes at most e^{threshold} of its norm, so running only those n trailing chunks from a
// zero state gives the entering state of segment j + 1 and M_j is not needed. When even the
// whole segment does not reach the threshold (heads with g == 0 never do), the state pass runs
// the whole segment and forms the exact M_j.
// Backward: dS flows from segment j to segment j - 1 through M_j^T; by the same bound, the
// leading n chunks of segment j whose summed log-decay is <= threshold suffice.
// Only boundaries inside a sequence are crossed: the last segment of a sequence has no forward
// window (its end state is the sequence's final state) and the first has no backward window
// (its entering dS is the sequence's d_initial_state).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "plan/cp_plan.h"
#include "plan/decay_window.h"

namespace flashgdn::plan {

struct DecayWindow {
  int64_t chunks = 0;    // chunks to run from a zero state: trailing ones (forward) or leading
                         // ones (backward); 0 when no state crosses this side of the segment
  bool needs_m = false;  // the threshold is not reached inside the segment: `chunks` is all of
                         // its chunks and the exact transition M is used
};

struct SegmentWindows {
  DecayWindow forward;   // towards the next segment
  DecayWindow backward;  // towards the previous segment
};

struct DecayWindowTable {
  int32_t num_v_heads = 0;
  std::vector<SegmentWindows> windows;  // [segment * num_v_heads + v_head], segments of the plan
  int64_t forward_m_count = 0;          // (segment, v-head) pairs whose forward needs M
  int64_t backward_m_count = 0;         // (segment, v-head) pairs whose backward needs M

  const SegmentWindows& at(int64_t segment, int32_t v_head) const {
    return windows[segment * num_v_heads + v_head];
  }
};

// Host gates of a whole sequence for one v-head: one log-space gate per token (length = the
// sequence's length).
using GateSource = std::function<std::span<const double>(int64_t sequence, int32_t v_head)>;

// Windows of every segment of `plan` and v-head. Throws std::invalid_argument when `threshold` is
// not negative (-infinity is allowed: no window, M everywhere) or a gate span's length differs
// from its sequence's.
DecayWindowTable segment_decay_windows(const CpPlan& plan, const GateSource& gates,
                                       double threshold = kDefaultDecayThreshold);

}  // namespace flashgdn::plan
