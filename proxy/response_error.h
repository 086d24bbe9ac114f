// How far a proxy's fault responses are from the original's, as one number
// per measure, so methods can be ranked against random pruning (proxy-eval's
// "vs random" columns): a method earns its place when its proxies answer a
// fault nearer the original's way than a random choice of experts does.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "proxy/trend_fidelity.h"

namespace moerr::proxy {

// A ratio past this factor either way counts as this factor (a response only
// one side shows has an infinite or zero ratio).
inline constexpr double kMagnitudeRatioCap = 16;

struct ResponseError {
  // Fault cases: each fault at each trainer seed (a pair of runs at the same
  // seed), every one weighing the same.
  int64_t faults = 0;
  // Mean over fault cases of |proxy onset - original onset|, steps. A run without
  // an onset is counted as having it one step past its last (step `end`),
  // so a response only one side shows costs the rest of the window; neither
  // responding costs 0. A proxy onset before the original's
  // (ResponseComparison::early) is a miss: counted as no proxy onset.
  double onset = std::numeric_limits<double>::quiet_NaN();
  // Mean over fault cases of the mean |log2| of the three response ratios
  // (ResponseComparison: grad spike, loss-scale drops, reward collapse), each
  // clamped to [1/kMagnitudeRatioCap, kMagnitudeRatioCap]: 0 when every
  // response is as large as the original's, 1 when a factor 2 apart.
  double magnitude = std::numeric_limits<double>::quiet_NaN();
};

// One fault case's response in the original and in a proxy (the same fault
// and trainer seed); both runs end before step `end`.
struct ResponsePair {
  FaultResponse original, proxy;
  int64_t end = 0;
};

// NaN measures when `responses` is empty.
ResponseError MeasureResponseError(const std::vector<ResponsePair>& responses);

}  // namespace moerr::proxy
