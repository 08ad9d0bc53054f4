// The decay-window rule (DESIGN §1, auto-CP).
//
// With L2-normalised keys and beta in (0,1], each token's linear map e^{g}(I - beta k k^T) has
// spectral norm <= e^{g}. So after n chunks whose summed log-decay is D <= threshold, whatever
// state entered those chunks contributes at most e^{D} of its norm: the state leaving them equals,
// to within e^{threshold}, the state obtained by running only those n chunks from a zero state.
// The affine transition M of the segment is then not needed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace flashgdn::plan {

inline constexpr double kDefaultDecayThreshold = -10.0;  // e^{-10} ~ 4.5e-5 of the state's norm

// Forward in time (used for the state entering the NEXT segment): the smallest number n >= 1 of
// trailing chunks of the token range `gates` (one gate per token, chunk-aligned at its start,
// `chunk` tokens per chunk, the last chunk possibly partial) whose gate sum is <= threshold.
// nullopt when even all chunks of the range do not reach the threshold (then the exact M is
// needed).
std::optional<int64_t> trailing_decay_window(std::span<const double> gates, int chunk,
                                             double threshold);

// Backward in time (used for dS leaving a segment towards the PREVIOUS one): the smallest number
// n >= 1 of leading chunks of the range whose gate sum is <= threshold, or nullopt.
std::optional<int64_t> leading_decay_window(std::span<const double> gates, int chunk,
                                            double threshold);

}  // namespace flashgdn::plan
