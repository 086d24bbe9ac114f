// A proxy-eval row's matched-KL noise row (issue 44): the warm original with
// weight noise at the proxy's logit KL, run through the same dynamics over
// the same trainer seeds and judged by the same band and predictor. It shows
// what any perturbation of that size does, so a proxy's dynamics are read
// beside it rather than against the unperturbed original alone.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "llvm/Support/JSON.h"
#include "moe/moe_transformer.h"
#include "proxy/seed_dynamics.h"
#include "proxy/trajectory.h"
#include "proxy/trend_fidelity.h"

namespace moerr::proxy {

// The noise direction of every noise row (Perturbed's generator seed): one
// fixed direction, so rows differ only by the size the KL calls for.
inline constexpr uint64_t kNoiseRowSeed = 0;

struct NoiseRow {
  // Non-empty: why there is no noise row (MatchNoiseToKl's message, e.g. a
  // KL that noise cannot reach); nothing below it was measured.
  std::string error;
  uint64_t noise_seed = kNoiseRowSeed;
  double target_kl = 0;  // the row's logit KL, per token
  double rel = 0;        // the matched noise, in units of each tensor's rms
  double kl = 0;         // the logit KL it reached on the same held-out tokens
  int64_t tries = 0;     // perturbed forwards the match took
  // The noisy original's own-rollout runs at the trainer seeds against the
  // original's band.
  SeedBands seed_band;
  // At the first trainer seed (5), against the original's run there: the
  // per-step Pearson r and the EMA-smoothed r of each metric.
  double corr_loss = std::numeric_limits<double>::quiet_NaN(), corr_reward = corr_loss, corr_kl = corr_loss,
         corr_grad_norm = corr_loss;
  double smoothed_corr_loss = corr_loss, smoothed_corr_reward = corr_loss, smoothed_corr_kl = corr_loss,
         smoothed_corr_grad_norm = corr_loss;
};

// The noise row of a row at logit KL `target_kl`: MatchNoiseToKl(warm,
// tokens, target_kl, kNoiseRowSeed) with its default factor (1.25), then
// TrainSeeds of the noisy original over original_seeds.size() seeds of
// `steps` steps, judged against `original_seeds` (TrainSeeds of `warm`, in
// TrainerSeeds order). A failed match is kept in `error`, not returned: the
// evaluation goes on without that row's noise.
NoiseRow MeasureNoiseRow(const moe::MoeTransformer& warm, const at::Tensor& tokens, double target_kl,
                         const std::vector<Trajectory>& original_seeds, int64_t steps, const TrendOptions& trend);

// "target_kl" and "noise_seed", then "error" alone when unmeasured; else the
// match ("rel", "kl", "tries"), "seed_band", and flat "corr_<metric>" and
// "smoothed_corr_<metric>" (loss, reward, kl, grad_norm), as a row's corr_loss.
llvm::json::Object ToJson(const NoiseRow& noise);

}  // namespace moerr::proxy
