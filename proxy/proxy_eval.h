// moerr proxy-eval (DESIGN.md, "Proxy": fidelity is measured, not assumed).
// From one warm model of a preset, for each kept fraction x method:
//   static fidelity on a held-out batch: hidden-state cosine (mean over
//     layers), logit KL(original || proxy) per token, routing agreement (the
//     share of the proxy's choices that are the medoids of the original's),
//     task accuracy;
//   dynamics: Pearson correlation of the loss, reward, KL and grad-norm
//     trajectories of N healthy RL steps of the proxy with the original's
//     (same seed, so the same prompts), twice: the proxy sampling its own
//     responses, and the proxy replaying the original's steps: its sampled
//     responses, and its routing mapped to the proxy's experts (as a recorded
//     step is replayed on a proxy);
//   trend fidelity (trend_fidelity.h): EMA-smoothed correlation, slope-sign
//     agreement over windows and total-drift ratio of the same trajectories;
//     these and the replayed run are of trainer seed 5;
//   dynamics over trainer seeds (seed_dynamics.h): the own-rollout runs of
//     the original and the proxy at each of `trainer_seeds` seeds, the
//     proxy's seed-mean against the original's band (mean +- 2 sd over
//     seeds), and the leave-one-seed-out r of the proxy beside that of one
//     more seed of the original;
//   noise rows (`noise_rows`, noise_row.h): per row, the warm original with
//     weight noise matched to the row's logit KL on the same held-out batch,
//     its own-rollout runs at the same trainer seeds judged by the same band
//     and predictor: what any perturbation of that size does;
//   fault response: each catalogue fault injected into the original and into
//     the proxy after `response_at` healthy steps, `response_steps` more
//     steps each, at each trainer seed, compared seed by seed: onset
//     difference, response magnitudes proxy / original, whether both recover
//     or persist alike;
//   fault reproduction: for each catalogue fault and seed, the original's
//     failing step is mapped to the proxy and model-replayed; reproduced when
//     the proxy's replay raises the lint finding that names the fault in the
//     original; localised when also in the same phase and module class
//     (module path without indices); the onset difference in steps; early
//     (not reproduced) when the proxy fails at a step before the original's
//     onset;
//   healing (`heal_steps` > 0): every configuration again with its proxies
//     healed (healing.h), reported beside the unhealed row;
//   cost: policy parameters, peak tensor memory (both models, gradients,
//     Adam state, activations) of two RL steps trained in micro-batches of
//     `memory_micro_batch` sequences, as a step is fitted onto fewer devices,
//     and of the whole-batch RL run; RL step time; each original / proxy.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "moe/fault.h"
#include "moe/moe_transformer.h"
#include "moe/step_metrics.h"
#include "proxy/clustering.h"
#include "proxy/expert_diversity.h"
#include "proxy/healing.h"
#include "proxy/method_ranking.h"
#include "proxy/noise_row.h"
#include "proxy/response_error.h"
#include "proxy/seed_dynamics.h"
#include "proxy/trajectory.h"
#include "proxy/trend_fidelity.h"
#include "replayer/step_failure.h"

namespace moerr::proxy {

struct EvalOptions {
  std::string preset = "small";
  moe::Family family = moe::Family::kQwen3Moe;
  // Non-empty: the model is this transformers config.json's (hf_config_file.h)
  // instead of preset's and family's; its warm-up is cached under
  // OUT/warmup/hf-DIGEST-STEPS (DIGEST: of the file's bytes).
  std::string hf_config;
  int64_t warmup_steps = 600;
  // Required: the warm-up checkpoint (OUT/warmup/PRESET-FAMILY-STEPS, reused
  // by a later run of the same three), bundles, report.
  std::string out_dir;
  int64_t steps = 30;                   // healthy RL steps for the dynamics
  // Trainer seeds of the healthy runs and the fault responses: 5, 6, ...,
  // 5 + trainer_seeds - 1 (TrainerSeeds). The per-step r, the trends and the
  // replayed run are of seed 5 alone; the seed band needs >= 2.
  int64_t trainer_seeds = 3;
  int64_t seeds = 3;                    // per fault
  std::vector<double> keeps = {0.5, 0.25, 0.125};
  // "cluster", "cluster-unforced", "cluster-frequency" (not run by default), and the baselines
  // "frequency", "random", "reap", "hc-medoid".
  std::vector<std::string> methods = {"cluster", "cluster-unforced", "frequency", "random", "reap", "hc-medoid"};
  std::vector<moe::FaultKind> faults = moe::AllFaults();
  int64_t memory_micro_batch = 2;  // sequences per training forward in the peak-memory steps
  TrendOptions trend;
  int64_t response_at = 3;     // healthy steps before a fault is injected (the response runs)
  int64_t response_steps = 5;  // steps after it
  int64_t heal_steps = 0;      // > 0: each configuration also with its proxies healed this long
  // Steps recorded per fault case of a fault whose onset comes from the
  // dynamics (moe::OnsetFromDynamics; the others: 2), and steps after it in
  // its fault response (the others: response_steps).
  int64_t dynamics_steps = 8;
  // Static fidelity only: no RL dynamics, fault response, fault reproduction
  // or cost beyond the parameter ratio (the quick way to compare methods).
  bool static_only = false;
  // Seed of the static fidelity's samples: the healthy step the proxies are
  // built from, their calibration batch, the held-out batch and the accuracy
  // problems (the original's accuracy is measured on the same problems).
  uint64_t sample_seed = 0;
  // With dynamics and trainer_seeds >= 2: each row's matched-KL noise row
  // (EvalRow::noise); with one trainer seed there is no band to judge it by.
  bool noise_rows = true;
};

// One fault's response in the original and in a proxy (trend_fidelity.h).
struct FaultResponseRow {
  moe::FaultKind fault = moe::FaultKind::kNone;
  FaultResponse original, proxy;
  ResponseComparison comparison;
  int64_t end = 0;  // one past both runs' last step
  uint64_t seed = kFirstTrainerSeed;  // the trainer seed of both runs
};

struct EvalRow {
  double keep = 0;
  std::string method;
  int64_t kept = 0;
  // The static proxy (built from the healthy step, healed when the row is)
  // kept as an HF checkpoint: OUT/proxies/<kept>of<E>-<method>[-heal<N>].
  std::string checkpoint;
  int64_t heal_steps = 0;  // > 0: the proxies were healed this long
  double heal_kl_before = 0, heal_kl_after = 0;  // of the static proxy, per token
  double hidden_cosine = 0, logit_kl = 0, routing_agreement = 0, accuracy = 0;
  double corr_loss = 0, corr_reward = 0, corr_kl = 0, corr_grad_norm = 0;  // own rollouts
  double replayed_corr_loss = 0, replayed_corr_kl = 0, replayed_corr_grad_norm = 0;  // the original's steps replayed
  int64_t cases = 0, reproduced = 0, localised = 0;
  // Cases the proxy showed the failure at a step before the original's onset
  // (counted neither reproduced nor localised).
  int64_t early = 0;
  double onset_delta = 0;  // mean |proxy onset - original onset| over reproduced cases, steps
  // Trends of the own-rollout and the replayed trajectories.
  Trend trend_loss, trend_reward, trend_kl, trend_grad_norm;
  Trend replayed_trend_loss, replayed_trend_kl, replayed_trend_grad_norm;
  // The own-rollout runs over the trainer seeds against the original's.
  SeedBands seed_band;
  // The original with weight noise at this row's logit KL, over the same
  // trainer seeds; nullopt when static only, without noise_rows or with one
  // trainer seed.
  std::optional<NoiseRow> noise;
  std::vector<FaultResponseRow> responses;  // per fault, per trainer seed
  // The fault responses' distance from the original's (response_error.h),
  // and random pruning's (the row of method "random" at the same keep and
  // healing) minus this row's: > 0 nearer the original than random; NaN
  // without a random row (CompareWithRandom).
  ResponseError response_error;
  double onset_vs_random = std::numeric_limits<double>::quiet_NaN();
  double magnitude_vs_random = std::numeric_limits<double>::quiet_NaN();
  // Original / proxy. Peak memory: micro-batched steps, and the whole-batch run.
  double params_ratio = 0, peak_memory_ratio = 0, whole_batch_peak_memory_ratio = 0, step_time_ratio = 0;
};

struct EvalReport {
  // What made it. Its JSON keeps, under "options", those that set the
  // numbers beyond the model: two reports pool into one table only where
  // they agree (ranking_merge.h). options.static_only: the rows hold static
  // fidelity and the parameter ratio only. A report built by hand sets
  // options.trainer_seeds too: the default, 3, has the ranking judge dynamics.
  EvalOptions options;
  std::string preset, family;  // with hf_config: the file, and the family it names
  std::string warm_checkpoint;  // the warm original, an HF checkpoint (OUT/warmup/...)
  double original_accuracy = 0;
  int64_t experts = 0;
  ExpertDiversity initial, warm;  // the preset's experts before and after the warm-up
  std::vector<EvalRow> rows;
  // The original's healthy runs (own rollouts, metrics only), one per
  // trainer seed in TrainerSeeds order; empty when static only.
  std::vector<Trajectory> original_seeds;
  // The methods ranked by the rule of method_ranking.h (RankMethods of the
  // rows above); nullopt only without rows.
  std::optional<MethodRanking> ranking;
};

// Each row's response_error from its responses, then its onset_vs_random
// and magnitude_vs_random.
void CompareWithRandom(std::vector<EvalRow>& rows);

// One fault-reproduction case as `row` counts it: the original first showed
// the failure at step `onset`; the proxies built from its recorded steps in
// order first showed it at `shown_at`, as `shown` (kNo: at no step). A proxy
// that shows it before the original's onset is early: it fails where the
// original did not, which is neither reproducing the fault nor localising
// it, whatever it shows later. onset_delta sums |shown_at - onset| over the
// reproduced cases (EvaluateProxies divides it by their count).
void CountCase(int64_t onset, int64_t shown_at, replayer::Reproduction shown, EvalRow& row);

using EvalProgress = std::function<void(const std::string& phase, int64_t done, int64_t total)>;

absl::StatusOr<EvalReport> EvaluateProxies(const EvalOptions& options, const EvalProgress& progress = nullptr);

// With the ranking under "ranking" when there is one.
llvm::json::Object ToJson(const EvalReport& report);

}  // namespace moerr::proxy
