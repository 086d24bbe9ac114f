// Dynamics measured by the shape of the training curves and by the response
// to a fault, not step by step (`moerr proxy-eval`): a proxy is faithful when
// its smoothed trajectories rise and fall with the original's and when a
// fault injected into both sets off the same response, of a like size, that
// ends the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "llvm/Support/JSON.h"
#include "moe/grpo_trainer.h"

namespace moerr::proxy {

// Pearson correlation over the pairs where both are finite; NaN when
// undefined (fewer than 3 pairs, or a constant series).
double Pearson(const std::vector<double>& a, const std::vector<double>& b);

// Exponential moving average with alpha = 2 / (window + 1) (the span
// convention of pandas' ewm), started at the first finite value; a
// non-finite value leaves the average where it was.
std::vector<double> Ema(const std::vector<double>& x, int64_t window);

struct TrendOptions {
  int64_t ema_window = 5;    // steps (EMA span)
  int64_t slope_window = 6;  // steps per window of the slope signs
};

struct Trend {
  // Pearson correlation of the EMA-smoothed series.
  double smoothed_corr = 0;
  // Share of the consecutive, non-overlapping windows of `slope_window`
  // steps in which the least-squares slopes of the smoothed series have the
  // same sign; a slope whose change over its window is under 1% of the
  // original's smoothed range counts as flat (sign 0); a window holding a
  // non-finite value counts as disagreeing.
  double slope_sign_agreement = 0;
  int64_t windows = 0;
  // Total drift of the smoothed series (last - first), proxy / original:
  // 1 when the proxy moves as far, negative when it moves the other way; NaN
  // when the original moves less than its flat band (1% of its smoothed
  // range), where the ratio would divide by rounding.
  double drift_ratio = 0;
};

Trend CompareTrend(const std::vector<double>& original, const std::vector<double>& proxy,
                   const TrendOptions& options = {});

// How one run answers a fault injected at step k. The healthy band is set by
// steps [0, k): a step is abnormal when it is not finite or skipped, lowers
// the loss scale, has a gradient norm over 3x the healthy median, a reward
// below half the healthy mean, a load entropy more than 0.1 under the
// healthy minimum, or a rollout ratio error over 10x the healthy maximum
// (and over 1e-4).
struct FaultResponse {
  int64_t onset = -1;          // first abnormal step >= k; -1: none
  double grad_spike = 0;       // max grad norm over steps >= k / healthy median (Inf: a non-finite one)
  int64_t scale_drops = 0;     // steps >= k that lowered the loss scale
  double reward_collapse = 0;  // (healthy mean reward - least reward from k) / healthy mean, >= 0
  enum class Outcome { kNone, kRecovered, kPersisting };
  // kPersisting: one of the last `tail` steps is abnormal (divergence, or a
  // fault that does not let go); kRecovered: abnormal steps, none at the end.
  Outcome outcome = Outcome::kNone;
};

FaultResponse MeasureResponse(const std::vector<moe::StepMetrics>& run, int64_t k, int64_t tail = 2);

// A proxy's response against the original's. A proxy whose onset comes
// before the original's is early: it answers a fault the original has not
// yet answered, so it is neither responding alike nor both responding.
struct ResponseComparison {
  // Both have an onset, the proxy's not before the original's.
  bool both_respond = false;
  // Both have an onset and the proxy's is not early, or neither has one.
  bool same_onset_presence = false;
  bool early = false;  // both have an onset, the proxy's before the original's
  // Proxy onset - original onset, when both have one (< 0: early).
  int64_t onset_delta = 0;
  // Proxy / original; 1 when both are nil (no spike: <= 1.5, no collapse:
  // < 0.05, no drops) or both infinite; Inf or 0 when only one responds.
  double grad_spike_ratio = 1, scale_drop_ratio = 1, reward_collapse_ratio = 1;
  bool same_outcome = false;
  // Every ratio within [1/2, 2].
  bool magnitude_within_2x = false;
};

ResponseComparison CompareResponse(const FaultResponse& original, const FaultResponse& proxy);

const char* OutcomeName(FaultResponse::Outcome o);
llvm::json::Object ToJson(const Trend& t);
llvm::json::Object ToJson(const FaultResponse& r);
llvm::json::Object ToJson(const ResponseComparison& c);

}  // namespace moerr::proxy
