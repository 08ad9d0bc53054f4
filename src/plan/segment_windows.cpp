#include "plan/segment_windows.h"

#include <optional>
#include <stdexcept>
#include <string>

namespace flashgdn::plan {
namespace {

DecayWindow window_or_m(std::optional<int64_t> window, int64_t segment_chunks, int64_t& m_count) {
  if (window) return {*window, false};
  ++m_count;
  return {segment_chunks, true};
}

}  // namespace

DecayWindowTable segment_decay_windows(const CpPlan& plan, const GateSource& gates,
                                       double threshold) {
  if (!(threshold < 0.0))
    throw std::invalid_argument("decay threshold = " + std::to_string(threshold) +
                                ", must be negative");
  DecayWindowTable table;
  table.num_v_heads = plan.num_v_heads;
  table.windows.resize(plan.segments.size() * static_cast<size_t>(plan.num_v_heads));
  for (int64_t sequence = 0; sequence < plan.num_sequences(); ++sequence) {
    const int64_t first = plan.first_segment[sequence];
    const int64_t last = plan.first_segment[sequence + 1] - 1;
    if (first >= last) continue;  // empty or not cut: nothing crosses a segment boundary
    for (int32_t head = 0; head < plan.num_v_heads; ++head) {
      const std::span<const double> sequence_gates = gates(sequence, head);
      if (static_cast<int64_t>(sequence_gates.size()) != plan.sequence_lengths[sequence])
        throw std::invalid_argument(
            "gates of sequence " + std::to_string(sequence) + ", v-head " + std::to_string(head) +
            " have " + std::to_string(sequence_gates.size()) + " tokens, the sequence has " +
            std::to_string(plan.sequence_lengths[sequence]));
      for (int64_t s = first; s <= last; ++s) {
        const Segment& segment = plan.segments[s];
        const auto segment_gates = sequence_gates.subspan(segment.offset, segment.tokens);
        SegmentWindows& windows = table.windows[s * plan.num_v_heads + head];
        if (s < last)
          windows.forward = window_or_m(trailing_decay_window(segment_gates, kChunkSize, threshold),
                                        segment.num_chunks(), table.forward_m_count);
        if (s > first)
          windows.backward = window_or_m(leading_decay_window(segment_gates, kChunkSize, threshold),
                                         segment.num_chunks(), table.backward_m_count);
      }
    }
  }
  return table;
}

}  // namespace flashgdn::plan
