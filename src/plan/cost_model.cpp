#include "plan/cost_model.h"

#include <algorithm>

namespace flashgdn::plan {

// Fitted by bench/fit_cost_model.py --direction bwd (record:
// bench/results/2026-11-30_cost_model_bwd_4449f24.json).
CostModel CostModel::backward() {
  CostModel model;
  model.fused_chunk_us = 27.217;
  model.fused_item_us = 27.107;
  model.state_chunk_us = 5.102;
  model.state_m_chunk_us = 0.000;
  model.state_item_us = 47.081;
  model.correction_step_us = 8.561;
  model.correction_m_step_us = 0.000;
  model.correction_item_us = 0.000;
  model.gate_scan_chunk_us = 7.596;
  model.launch_us = 0.003;
  model.min_segment_chunks = 4;
  return model;
}

double makespan_us(std::vector<WorkGroup> groups, int64_t slots) {
  std::sort(groups.begin(), groups.end(),
            [](const WorkGroup& a, const WorkGroup& b) { return a.cost_us > b.cost_us; });
  double total = 0.0;
  double wave_bound = 0.0;
  int64_t before = 0;  // items of larger cost
  for (const WorkGroup& group : groups) {
    if (group.count <= 0) continue;
    total += group.cost_us * static_cast<double>(group.count);
    // Largest m with item mP + 1 (1-based) inside or before this group: p_{mP+1} >= this cost.
    const int64_t m = (before + group.count - 1) / slots;
    wave_bound = std::max(wave_bound, static_cast<double>(m + 1) * group.cost_us);
    before += group.count;
  }
  return std::max(wave_bound, total / static_cast<double>(slots));
}

}  // namespace flashgdn::plan
