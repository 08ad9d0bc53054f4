// Cost model of the GDN prefill kernels on one GPU, used to decide intra-card sequence
// parallelism (auto-CP, DESIGN §1).
//
// Work items. Every kernel runs one CTA per work item and the GPU executes items on
// `num_sms * ctas_per_sm` slots. A kernel's time is its launch overhead plus the makespan of its
// items on those slots:
//
//   no CP:  fused        items = (sequence, v-head), cost = item + chunks * fused_chunk
//   CP:     gate scan    items = segment (all heads in one CTA), cost = chunks * gate_scan_chunk
//           state pass   items = (segment with a successor, v-head): the zero-start end state S*,
//                        and the segment's transition M where the head needs it:
//                          exact-M head:  item + chunks * (state_chunk + state_m_chunk)
//                          window head:   item + min(window, chunks) * state_chunk
//           correction   items = (split sequence, v-head, V-slice), serial over the boundaries:
//                          item + (segments - 1) * (step + [exact-M head] m_step)
//           fused        items = (segment, v-head), as without CP
//
// The kernel that inverts the per-chunk triangular systems runs before either path and is fully
// parallel over chunks, so it costs the same with and without CP and is left out.
//
// Makespan of a set of items on P slots: the larger of the average load (total / P) and the wave
// sum p_1 + p_{P+1} + p_{2P+1} + ... (items sorted by decreasing cost p_1 >= p_2 >= ...; wave w
// holds items wP+1 .. (w+1)P and starts when the previous one ends). It is exact for equal items
// (ceil(n / P) waves), and it charges a wave for short items that spill past full ones: 16 x 16
// items of 31 chunks plus 16 of 16 take three waves on 132 SMs, 78 chunks, where 16 x 16 of 32
// take two, 64 (sequences of different lengths cut at one L give such mixes).
//
// One wave of the seed's model: a sequence of N chunks cut into N / L segments of L chunks costs
// about lambda_1 * L (the parallel state pass and fused kernel, per-chunk costs) plus
// lambda_2 * N / L (the serial correction, per-segment costs): T = lambda_1 L + lambda_2 N / L is
// smallest at L = sqrt(lambda_2 N / lambda_1). Once the segments of all heads exceed one wave,
// the average-load bound takes over and further splitting only adds correction steps.
//
// The default coefficients (microseconds) are fitted on the H200 by bench/fit_cost_model.py to
// flashgdn's forward kernels (record: bench/results/2026-11-30_cost_model_ab2cb94.json): the
// planner's own predict_time_us, through bench/cp_plan_predict, is matched to the measured change
// t(L) - t(no CP) of whole calls cut at L = 4 .. 128 chunks on the tables' low-parallelism shapes
// (the split scan of bench/cp_sweep.py), relative error minimised. The planner assumes every head
// needs the exact M, so only the sums state + state_m and step + m_step are observable: the fit
// puts them into state_chunk_us and correction_step_us (the M extras 0). Refit after any change
// to the fused, state-pass, window or correction kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace flashgdn::plan {

struct CostModel {
  // Serial fused kernel (o and the running state), per (sequence or segment, v-head).
  double fused_chunk_us = 2.689;  // per chunk
  double fused_item_us = 17.460;     // per item: entering-state load, final-state store
  // State-only pass (S*, and M where a head needs it), per (segment, v-head).
  double state_chunk_us = 0.760;  // per chunk, S* alone
  double state_m_chunk_us = 0.000;   // extra per chunk when M is formed as well
  double state_item_us = 0.001;      // per item: S* (and M) store
  // Serial correction S_{j+1} = S*_j + M_j S_j, per (sequence, v-head, V-slice).
  double correction_step_us = 3.908;     // per segment boundary: read S*_j
  double correction_m_step_us = 0.000;  // extra per boundary when M_j is applied
  double correction_item_us = 0.000;
  int32_t correction_slices_per_head = 4;  // V columns split across CTAs
  // Gate scan that finds the decay windows, per segment (all heads in one CTA).
  double gate_scan_chunk_us = 0.624;
  // Every kernel launch.
  double launch_us = 9.526;
  // The shortest target length plan_cp considers (CpOptions can only raise it): chosen by
  // bench/fit_cost_model.py from the planner's choices on the split scan.
  int64_t min_segment_chunks = 8;
  // Concurrent CTAs per SM of the heavy kernels (fused, state pass) and of the light ones (gate
  // scan, correction).
  int32_t heavy_ctas_per_sm = 1;
  int32_t light_ctas_per_sm = 8;

  // The backward's coefficients (cost_model.cpp), fitted on the H200 by
  // bench/fit_cost_model.py --direction bwd to the whole backward call: the fused chunk stands for
  // the chunk-state recompute, the dS pass and the gradient pass, the state pass for the forward S* pass plus
  // the dS* pass, the correction for the forward and the reverse (M^T) scans.
  static CostModel backward();
};

// `count` items of `cost_us` each.
struct WorkGroup {
  double cost_us = 0.0;
  int64_t count = 0;
};

// Lower-bound makespan (see the header comment) of the items on `slots` slots; 0 without items.
double makespan_us(std::vector<WorkGroup> groups, int64_t slots);

}  // namespace flashgdn::plan
