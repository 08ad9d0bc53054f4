#include "plan/decay_window.h"

namespace flashgdn::plan {

std::optional<int64_t> trailing_decay_window(std::span<const double> gates, int chunk,
                                             double threshold) {
  const int64_t T = static_cast<int64_t>(gates.size());
  const int64_t num_chunks = (T + chunk - 1) / chunk;
  double sum = 0.0;
  for (int64_t n = 1; n <= num_chunks; ++n) {
    const int64_t c = num_chunks - n;
    const int64_t end = (c + 1) * chunk < T ? (c + 1) * chunk : T;
    for (int64_t t = c * chunk; t < end; ++t) sum += gates[t];
    if (sum <= threshold) return n;
  }
  return std::nullopt;
}

std::optional<int64_t> leading_decay_window(std::span<const double> gates, int chunk,
                                            double threshold) {
  const int64_t T = static_cast<int64_t>(gates.size());
  const int64_t num_chunks = (T + chunk - 1) / chunk;
  double sum = 0.0;
  for (int64_t n = 1; n <= num_chunks; ++n) {
    const int64_t c = n - 1;
    const int64_t end = (c + 1) * chunk < T ? (c + 1) * chunk : T;
    for (int64_t t = c * chunk; t < end; ++t) sum += gates[t];
    if (sum <= threshold) return n;
  }
  return std::nullopt;
}

}  // namespace flashgdn::plan
