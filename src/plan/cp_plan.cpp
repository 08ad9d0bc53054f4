#include "plan/cp_plan.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace flashgdn::plan {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

void check_problem(const CpProblem& problem, const CpOptions& options) {
  if (problem.num_v_heads < 1)
    throw std::invalid_argument("num_v_heads = " + std::to_string(problem.num_v_heads) +
                                ", must be >= 1");
  if (problem.num_sms < 1)
    throw std::invalid_argument("num_sms = " + std::to_string(problem.num_sms) + ", must be >= 1");
  if (static_cast<int64_t>(problem.sequence_lengths.size()) > kMaxInt32)
    throw std::invalid_argument("more sequences than int32 can index");
  for (size_t i = 0; i < problem.sequence_lengths.size(); ++i) {
    const int64_t length = problem.sequence_lengths[i];
    if (length < 0 || num_chunks_of(length) > kMaxInt32)
      throw std::invalid_argument("sequence_lengths[" + std::to_string(i) +
                                  "] = " + std::to_string(length) +
                                  " is negative or has more chunks than int32 can index");
  }
  if (options.min_segment_chunks < 1)
    throw std::invalid_argument(
        "min_segment_chunks = " + std::to_string(options.min_segment_chunks) + ", must be >= 1");
  if (!(options.min_relative_gain >= 0.0 && options.min_relative_gain < 1.0))
    throw std::invalid_argument("min_relative_gain = " + std::to_string(options.min_relative_gain) +
                                ", must be in [0, 1)");
  if (options.assumed_m_heads < -1 || options.assumed_m_heads > problem.num_v_heads)
    throw std::invalid_argument("assumed_m_heads = " + std::to_string(options.assumed_m_heads) +
                                ", must be -1 (all) or in [0, num_v_heads]");
  if (options.assumed_window_chunks < 0)
    throw std::invalid_argument("assumed_window_chunks = " +
                                std::to_string(options.assumed_window_chunks) + ", must be >= 0");
}

void check_model(const CostModel& model) {
  for (const double us :
       {model.fused_chunk_us, model.fused_item_us, model.state_chunk_us, model.state_m_chunk_us,
        model.state_item_us, model.correction_step_us, model.correction_m_step_us,
        model.correction_item_us, model.gate_scan_chunk_us, model.launch_us})
    if (!(us >= 0.0)) throw std::invalid_argument("cost model coefficients must be >= 0");
  if (model.heavy_ctas_per_sm < 1 || model.light_ctas_per_sm < 1 ||
      model.correction_slices_per_head < 1 || model.min_segment_chunks < 1)
    throw std::invalid_argument(
        "cost model CTAs per SM, correction slices per head and min_segment_chunks must be >= 1");
}

CpPlan empty_plan(const CpProblem& problem, const CpOptions& options) {
  CpPlan plan;
  plan.num_v_heads = problem.num_v_heads;
  plan.num_sms = problem.num_sms;
  plan.assumed_m_heads =
      options.assumed_m_heads < 0 ? problem.num_v_heads : options.assumed_m_heads;
  plan.assumed_window_chunks = options.assumed_window_chunks;
  plan.sequence_lengths.assign(problem.sequence_lengths.begin(), problem.sequence_lengths.end());
  plan.first_segment.push_back(0);
  return plan;
}

// Work items of each kernel, filled segment by segment.
class PipelineItems {
 public:
  PipelineItems(const CostModel& model, int32_t heads, int32_t m_heads, int64_t window_chunks)
      : model_(model), heads_(heads), m_heads_(m_heads), window_chunks_(window_chunks) {}

  // `count` segments of `chunks` chunks; `has_successor`: the state leaving them enters another
  // segment (only those need the gate scan and the state pass).
  void add_segments(int64_t chunks, bool has_successor, int64_t count) {
    const double c = static_cast<double>(chunks);
    add(fused_, {model_.fused_item_us + c * model_.fused_chunk_us, count * heads_});
    if (!has_successor) return;
    add(gate_scan_, {c * model_.gate_scan_chunk_us, count});
    add(state_, {model_.state_item_us + c * (model_.state_chunk_us + model_.state_m_chunk_us),
                 count * m_heads_});
    const double window = static_cast<double>(std::min(window_chunks_, chunks));
    add(state_,
        {model_.state_item_us + window * model_.state_chunk_us, count * (heads_ - m_heads_)});
  }

  // `count` sequences cut into `segments` segments each: the serial correction over their
  // segments - 1 boundaries.
  void add_split_sequences(int64_t segments, int64_t count) {
    if (segments < 2 || count == 0) return;
    split_ = true;
    const double steps = static_cast<double>(segments - 1);
    const int64_t slices = model_.correction_slices_per_head;
    add(correction_, {model_.correction_item_us +
                          steps * (model_.correction_step_us + model_.correction_m_step_us),
                      count * m_heads_ * slices});
    add(correction_, {model_.correction_item_us + steps * model_.correction_step_us,
                      count * (heads_ - m_heads_) * slices});
  }

  // The CP pipeline when some sequence is cut, the fused kernel alone otherwise.
  double time_us(int32_t num_sms) const {
    const int64_t heavy_slots = int64_t{num_sms} * model_.heavy_ctas_per_sm;
    const int64_t light_slots = int64_t{num_sms} * model_.light_ctas_per_sm;
    double total = kernel_us(fused_, heavy_slots);
    if (split_)
      total += kernel_us(gate_scan_, light_slots) + kernel_us(state_, heavy_slots) +
               kernel_us(correction_, light_slots);
    return total;
  }

 private:
  // Appends a group, merged into the previous one when the costs match (runs of equal segments).
  static void add(std::vector<WorkGroup>& groups, WorkGroup group) {
    if (group.count == 0) return;
    if (!groups.empty() && groups.back().cost_us == group.cost_us)
      groups.back().count += group.count;
    else
      groups.push_back(group);
  }

  double kernel_us(const std::vector<WorkGroup>& items, int64_t slots) const {
    return items.empty() ? 0.0 : model_.launch_us + makespan_us(items, slots);
  }

  const CostModel& model_;
  int64_t heads_, m_heads_, window_chunks_;
  bool split_ = false;
  std::vector<WorkGroup> fused_, gate_scan_, state_, correction_;
};

// Modelled time of split_plan(segment_chunks) from the histogram {chunks, number of sequences}
// of the non-empty sequences, without building the segments. `no_cp` supplies the heads, SMs and
// decay-window assumptions.
double split_time_us(const std::vector<std::pair<int64_t, int64_t>>& chunk_histogram,
                     int64_t segment_chunks, const CostModel& model, const CpPlan& no_cp) {
  PipelineItems items(model, no_cp.num_v_heads, no_cp.assumed_m_heads, no_cp.assumed_window_chunks);
  for (const auto& [chunks, count] : chunk_histogram) {
    const int64_t n = num_segments_of(chunks, segment_chunks);
    const int64_t base = chunks / n, longer = chunks % n;  // the `longer` first ones: base + 1
    items.add_segments(base + 1, true, longer * count);
    items.add_segments(base, true, (n - longer - 1) * count);
    items.add_segments(base, false, count);
    items.add_split_sequences(n, count);
  }
  return items.time_us(no_cp.num_sms);
}

}  // namespace

std::vector<int64_t> CpPlan::segment_begins(int64_t sequence) const {
  std::vector<int64_t> begins;
  for (int64_t s = first_segment[sequence]; s < first_segment[sequence + 1]; ++s)
    begins.push_back(segments[s].offset);
  return begins;
}

CpPlan split_plan(const CpProblem& problem, int64_t segment_chunks, const CpOptions& options) {
  check_problem(problem, options);
  if (segment_chunks < 1)
    throw std::invalid_argument("segment_chunks = " + std::to_string(segment_chunks) +
                                ", must be >= 1");
  CpPlan plan = empty_plan(problem, options);
  for (int64_t i = 0; i < plan.num_sequences(); ++i) {
    const int64_t length = plan.sequence_lengths[i];
    const int64_t chunks = num_chunks_of(length);
    const int64_t n = num_segments_of(chunks, segment_chunks);
    const int64_t base = n ? chunks / n : 0, longer = n ? chunks % n : 0;
    int64_t offset = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t end = j + 1 == n ? length : offset + (base + (j < longer)) * kChunkSize;
      plan.segments.push_back(
          {static_cast<int32_t>(i), static_cast<int32_t>(j), offset, end - offset});
      offset = end;
    }
    plan.first_segment.push_back(static_cast<int64_t>(plan.segments.size()));
    if (n > 1) plan.enabled = true;
  }
  plan.target_segment_chunks = plan.enabled ? segment_chunks : 0;
  return plan;
}

CpPlan no_cp_plan(const CpProblem& problem, const CpOptions& options) {
  check_problem(problem, options);
  CpPlan plan = empty_plan(problem, options);
  for (int64_t i = 0; i < plan.num_sequences(); ++i) {
    if (plan.sequence_lengths[i] > 0)
      plan.segments.push_back({static_cast<int32_t>(i), 0, 0, plan.sequence_lengths[i]});
    plan.first_segment.push_back(static_cast<int64_t>(plan.segments.size()));
  }
  return plan;
}

double predict_time_us(const CpPlan& plan, const CostModel& model) {
  check_model(model);
  PipelineItems items(model, plan.num_v_heads, plan.assumed_m_heads, plan.assumed_window_chunks);
  for (int64_t i = 0; i < plan.num_sequences(); ++i) {
    const int64_t n = plan.num_segments_of(i);
    for (int64_t j = 0; j < n; ++j)
      items.add_segments(plan.segments[plan.first_segment[i] + j].num_chunks(), j + 1 < n, 1);
    items.add_split_sequences(n, 1);
  }
  return items.time_us(plan.num_sms);
}

CpPlan plan_cp(const CpProblem& problem, const CostModel& model, const CpOptions& requested) {
  check_model(model);
  CpOptions options = requested;  // the model's shortest paying segment bounds the cut as well
  options.min_segment_chunks = std::max(options.min_segment_chunks, model.min_segment_chunks);
  CpPlan no_cp = no_cp_plan(problem, options);
  const double budget_us = (1.0 - options.min_relative_gain) * predict_time_us(no_cp, model);

  // Any CP plan runs four kernels and at least the fused kernel's average load; when that alone
  // exceeds the budget (the sequences already fill the SMs), no candidate needs evaluating.
  const int64_t heavy_slots = int64_t{problem.num_sms} * model.heavy_ctas_per_sm;
  double fused_work_us = 0.0;
  int64_t max_chunks = 0;
  std::vector<int64_t> chunk_counts;
  for (const int64_t length : no_cp.sequence_lengths) {
    if (length == 0) continue;
    const int64_t chunks = num_chunks_of(length);
    fused_work_us += problem.num_v_heads *
                     (model.fused_item_us + static_cast<double>(chunks) * model.fused_chunk_us);
    max_chunks = std::max(max_chunks, chunks);
    chunk_counts.push_back(chunks);
  }
  if (4 * model.launch_us + fused_work_us / static_cast<double>(heavy_slots) >= budget_us)
    return no_cp;

  std::sort(chunk_counts.begin(), chunk_counts.end());
  std::vector<std::pair<int64_t, int64_t>> chunk_histogram;
  for (const int64_t chunks : chunk_counts) {
    if (chunk_histogram.empty() || chunk_histogram.back().first != chunks)
      chunk_histogram.push_back({chunks, 0});
    ++chunk_histogram.back().second;
  }

  // Cuts of the longest sequence into n segments (L = ceil(C_max / n), none shorter than the
  // minimum segment), up to 4 waves of its items alone.
  const int64_t max_splits =
      std::min((max_chunks + options.min_segment_chunks - 1) / options.min_segment_chunks,
               4 * heavy_slots / problem.num_v_heads + 1);
  int64_t best_segment_chunks = 0;
  double best_us = budget_us;
  for (int64_t n = 2, previous = 0; n <= max_splits; ++n) {
    const int64_t segment_chunks = std::max((max_chunks + n - 1) / n, options.min_segment_chunks);
    if (segment_chunks == previous) continue;
    previous = segment_chunks;
    const double t = split_time_us(chunk_histogram, segment_chunks, model, no_cp);
    if (t < best_us) {
      best_us = t;
      best_segment_chunks = segment_chunks;
    }
  }
  if (best_segment_chunks == 0) return no_cp;
  // The decision stands on the full plan's own modelled time.
  CpPlan plan = split_plan(problem, best_segment_chunks, options);
  return plan.enabled && predict_time_us(plan, model) < budget_us ? plan : no_cp;
}

}  // namespace flashgdn::plan
