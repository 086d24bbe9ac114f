#include "proxy/noise_row.h"

#include "formats/json_number.h"
#include "proxy/weight_noise.h"
#include "support/check.h"

namespace moerr::proxy {

NoiseRow MeasureNoiseRow(const moe::MoeTransformer& warm, const at::Tensor& tokens, double target_kl,
                         const std::vector<Trajectory>& original_seeds, int64_t steps, const TrendOptions& trend) {
  MOERR_CHECK(!original_seeds.empty()) << "a noise row needs the original's runs";
  NoiseRow row;
  row.target_kl = target_kl;
  absl::StatusOr<MatchedNoise> matched = MatchNoiseToKl(warm, tokens, target_kl, row.noise_seed);
  if (!matched.ok()) {
    row.error = std::string(matched.status().message());
    return row;
  }
  row.rel = matched->rel;
  row.kl = matched->kl;
  row.tries = matched->tries;
  const std::vector<Trajectory> runs =
      TrainSeeds(matched->model, steps, static_cast<int64_t>(original_seeds.size()));
  row.seed_band = MeasureSeedBands(original_seeds, runs, trend.ema_window);
  const Trajectory &original = original_seeds.front(), &t = runs.front();  // trainer seed 5
  SetPerStepR(original, t, row);
  row.smoothed_corr_loss = CompareTrend(original.loss, t.loss, trend).smoothed_corr;
  row.smoothed_corr_reward = CompareTrend(original.reward, t.reward, trend).smoothed_corr;
  row.smoothed_corr_kl = CompareTrend(original.kl, t.kl, trend).smoothed_corr;
  row.smoothed_corr_grad_norm = CompareTrend(original.grad_norm, t.grad_norm, trend).smoothed_corr;
  return row;
}

llvm::json::Object ToJson(const NoiseRow& noise) {
  const auto& num = formats::JsonNumber;
  if (!noise.error.empty()) {
    return llvm::json::Object{{"error", noise.error},
                              {"target_kl", num(noise.target_kl)},
                              {"noise_seed", static_cast<int64_t>(noise.noise_seed)}};
  }
  return llvm::json::Object{
      {"target_kl", num(noise.target_kl)},
      {"noise_seed", static_cast<int64_t>(noise.noise_seed)},
      {"rel", num(noise.rel)},
      {"kl", num(noise.kl)},
      {"tries", noise.tries},
      {"seed_band", ToJson(noise.seed_band)},
      {"corr_loss", num(noise.corr_loss)},
      {"corr_reward", num(noise.corr_reward)},
      {"corr_kl", num(noise.corr_kl)},
      {"corr_grad_norm", num(noise.corr_grad_norm)},
      {"smoothed_corr_loss", num(noise.smoothed_corr_loss)},
      {"smoothed_corr_reward", num(noise.smoothed_corr_reward)},
      {"smoothed_corr_kl", num(noise.smoothed_corr_kl)},
      {"smoothed_corr_grad_norm", num(noise.smoothed_corr_grad_norm)}};
}

}  // namespace moerr::proxy
