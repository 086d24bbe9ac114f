// A proxy's dynamics judged against the original's own spread over trainer
// seeds (`moerr proxy-eval`, issue 44): one run of a few dozen steps is
// mostly its own sampling noise, so a proxy is held to what another seed of
// the original would do, not to one run of it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "llvm/Support/JSON.h"

namespace moerr::proxy {

// One metric's trajectories of the original and a proxy over the same S
// trainer seeds, each series EMA-smoothed (Ema) first.
struct SeedBand {
  // Share of steps t on which the proxy's mean over seeds lies within the
  // original's mean +- 2 sample standard deviations (n - 1) over seeds; a
  // step where either is not finite counts as outside.
  double in_band = std::numeric_limits<double>::quiet_NaN();
  // Leave one seed out: for each seed i the target is the mean of the
  // original's other seeds. r_extra_seed: mean over i of Pearson(original_i,
  // target_i), how well one more seed of the original predicts it; r_proxy:
  // mean over i of Pearson(proxy_i, target_i). NaN when any seed's r is
  // undefined (a constant series, fewer than 3 finite steps).
  double r_proxy = std::numeric_limits<double>::quiet_NaN();
  double r_extra_seed = std::numeric_limits<double>::quiet_NaN();
  int64_t seeds = 0, steps = 0;
};

// `original[i]` and `proxy[i]` are the runs of trainer seed i (the same
// prompts); steps: the shortest series. Every measure is NaN for fewer
// than 2 seeds (no spread, no other seed to predict).
SeedBand MeasureSeedBand(const std::vector<std::vector<double>>& original,
                         const std::vector<std::vector<double>>& proxy, int64_t ema_window);

// The goal (issue 44): in band on at least this share of steps.
inline constexpr double kInBandGoal = 0.9;

// What keeps `band` of `metric` from the goal: the share in band under
// kInBandGoal, and r_proxy under r_extra_seed, each with its shortfall (an
// undefined measure fails); empty when it holds.
std::vector<std::string> SeedBandShortfalls(const std::string& metric, const SeedBand& band);

llvm::json::Object ToJson(const SeedBand& band);

}  // namespace moerr::proxy
