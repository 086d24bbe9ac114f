// proxy-eval's dynamics over several trainer seeds (issue 44): the healthy
// runs of the original and of a proxy at the same seeds, each metric judged
// against the original's own spread (seed_band.h), and the goal a proxy is
// held to.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "llvm/Support/JSON.h"
#include "moe/moe_transformer.h"
#include "proxy/seed_band.h"
#include "proxy/trajectory.h"
#include "proxy/trend_fidelity.h"

namespace moerr::proxy {

// The trainer seeds of a run over `count` seeds: 5, 6, ..., 5 + count - 1.
// Seed 5 comes first: the single-seed measures (per-step r, trends, the
// replayed run) are those of seed 5.
inline constexpr uint64_t kFirstTrainerSeed = 5;
std::vector<uint64_t> TrainerSeeds(int64_t count);

// `t` with its metric series only (its responses and routing dropped): what
// is kept of the runs at the other seeds.
Trajectory MetricsOnly(Trajectory t);

// Healthy runs of `model` (Train, own rollouts) at TrainerSeeds(count),
// metrics only; `first`, when given, is the run at the first seed, already made.
std::vector<Trajectory> TrainSeeds(const moe::MoeTransformer& model, int64_t steps, int64_t count,
                                   const Trajectory* first = nullptr);

// The seed band of each metric of the own-rollout runs.
struct SeedBands {
  SeedBand loss, reward, kl, grad_norm;
};

// original[i] and proxy[i]: the runs at the same trainer seed.
SeedBands MeasureSeedBands(const std::vector<Trajectory>& original, const std::vector<Trajectory>& proxy,
                           int64_t ema_window);

// The metrics the goal judges, by name as a shortfall names them: reward,
// KL and grad norm of `bands` (the loss is reported, not judged).
std::vector<std::pair<std::string, const SeedBand*>> GoalBands(const SeedBands& bands);

// Whether the goal of issue 44 holds: for reward, KL and grad norm, the
// proxy's seed-mean in the original's band on >= kInBandGoal of the steps
// and r_proxy >= r_extra_seed (the loss is reported, not judged). Empty when
// it holds; otherwise each metric that fails and by how much.
std::vector<std::string> SeedGoalShortfalls(const SeedBands& bands);
// Of the GoalBands, how many meet the goal (0..3).
int64_t SeedGoalMetricsMet(const SeedBands& bands);

// The per-step Pearson r of each metric of `t` against `original` (the runs
// at one trainer seed) into row.corr_loss, corr_reward, corr_kl and
// corr_grad_norm: for an EvalRow and a NoiseRow alike.
template <typename Row>
void SetPerStepR(const Trajectory& original, const Trajectory& t, Row& row) {
  row.corr_loss = Pearson(original.loss, t.loss);
  row.corr_reward = Pearson(original.reward, t.reward);
  row.corr_kl = Pearson(original.kl, t.kl);
  row.corr_grad_norm = Pearson(original.grad_norm, t.grad_norm);
}

llvm::json::Object ToJson(const SeedBands& bands);
// The metric series of a run (loss, reward, KL, grad norm per step).
llvm::json::Object SeriesJson(const Trajectory& t);

}  // namespace moerr::proxy
