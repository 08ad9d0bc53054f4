#include "plan/cost_model.h"

#include <algorithm>

namespace flashgdn::plan {

// Fitted by bench/fit_cost_model.py --direction bwd (record:
// bench/results/2026-11-30_cost_model_bwd_ab2cb94.json).
CostModel CostModel::backward() {
  CostModel model;
  model.fused_chunk_us = 6.479;
  model.fused_item_us = 31.161;
  model.state_chunk_us = 1.553;
  model.state_m_chunk_us = 0.000;
  model.state_item_us = 0.069;
  model.correction_step_us = 10.699;
  model.correction_m_step_us = 0.000;
  model.correction_item_us = 0.000;
  model.gate_scan_chunk_us = 3.642;
  model.launch_us = 7.332;
  model.min_segment_chunks = 4;
  return model;
}

double makespan_us(std::vector<WorkGroup> groups, int64_t slots) {
  std::sort(groups.begin(), groups.end(),
            [](const WorkGroup& a, const WorkGroup& b) { return a.cost_us > b.cost_us; });
  double total = 0.0;
  double waves = 0.0;  // sum over waves w of p_{wP+1}, the first (largest) item of each wave
  int64_t before = 0;  // items of larger cost
  for (const WorkGroup& group : groups) {
    if (group.count <= 0) continue;
    total += group.cost_us * static_cast<double>(group.count);
    // waves whose first item (0-based position wP) lies in [before, before + count)
    const int64_t first_wave = (before + slots - 1) / slots;
    const int64_t last_wave = (before + group.count - 1) / slots;
    if (last_wave >= first_wave) waves += static_cast<double>(last_wave - first_wave + 1) * group.cost_us;
    before += group.count;
  }
  return std::max(waves, total / static_cast<double>(slots));
}

}  // namespace flashgdn::plan
