#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/json_file.h"
#include "moe/addition_task.h"
#include "moe/moe_config.h"
#include "proxy/hf_config_file.h"
#include "proxy/method_ranking.h"
#include "proxy/proxy_eval.h"
#include "proxy/ranking_merge.h"
#include "proxy/weight_noise.h"
#include "support/filesystem.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/rank_cost_eval.h"

namespace moerr::tools {
namespace {

// `v` with `digits` decimals and `suffix`; "-" when not finite (undefined).
std::string Cell(double v, int digits = 3, const char* suffix = "") {
  return std::isfinite(v) ? absl::StrFormat("%.*f%s", digits, v, suffix) : std::string("-");
}

// The options bind to the library's structs, whose defaults are the
// command's: --keep parses into both (fractions for the evaluation, their
// text for the cost on fewer ranks); --faults' names are read by each mode.
struct ProxyEvalArgs {
  proxy::EvalOptions eval;
  std::vector<std::string> faults;
  std::string json;
  std::vector<std::string> pool;  // non-empty: rank these --json reports pooled, run nothing
  int64_t ranks = 0;  // > 0: the cost on fewer ranks (rank_cost_eval.h)
  world::RankCostOptions on_ranks;  // --child-timeout, --rounds and --keep bind here
};

// --keep's fractions "1/2 1/4 1/8" into `args`: each as a fraction for the
// evaluation, and as its text for the cost on fewer ranks.
absl::Status ParseKeeps(const std::vector<std::string>& keeps, ProxyEvalArgs& args) {
  args.eval.keeps.clear();
  for (const std::string& k : keeps) {
    const std::optional<double> fraction = ParseFraction(k);
    if (!fraction) return absl::InvalidArgumentError("--keep " + k + ": a fraction like 1/4");
    args.eval.keeps.push_back(*fraction);
  }
  args.on_ranks.keeps = keeps;
  return absl::OkStatus();
}

// --ranks N: the options of the cost on fewer ranks (every fault by default):
// --preset and --warmup-steps only when given (world::RankCostOptions' defaults,
// wide-ep and 20, otherwise); the options it does not use are refused.
absl::StatusOr<world::RankCostOptions> RankCostOptionsOf(const ProxyEvalArgs& args, const CLI::App& cmd) {
  for (const char* unused : {"--hf-config", "--family", "--methods", "--heal", "--seeds", "--steps",
                             "--memory-micro-batch",
                             "--ema-window", "--slope-window", "--response-at", "--response-steps", "--static-only",
                             "--sample-seed", "--dynamics-steps", "--trainer-seeds", "--noise-rows"}) {
    if (cmd.get_option(unused)->count() > 0) {
      return absl::InvalidArgumentError(absl::StrFormat("proxy-eval --ranks does not use %s", unused));
    }
  }
  world::RankCostOptions o = args.on_ranks;
  if (cmd.get_option("--preset")->count() > 0) o.preset = args.eval.preset;
  if (cmd.get_option("--warmup-steps")->count() > 0) o.warmup_steps = args.eval.warmup_steps;
  o.ranks = args.ranks;
  o.out_dir = args.eval.out_dir;
  // A step or two per fault there: the faults that fail at once.
  for (const moe::FaultKind f : moe::AllFaults()) {
    if (!moe::OnsetFromDynamics(f)) o.faults.push_back(moe::FaultName(f));
  }
  if (!args.faults.empty()) o.faults = args.faults;
  // Each fault's run there is one step: a dynamics fault would not show in
  // it, and every row would read as a fault not reproduced.
  for (const std::string& fault : o.faults) {
    const absl::StatusOr<moe::FaultKind> f = moe::ParseFault(fault);
    if (f.ok() && moe::OnsetFromDynamics(*f)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "proxy-eval --ranks: %s fails only steps after injection, and --ranks trains one step per fault; "
          "evaluate it without --ranks",
          fault));
    }
  }
  return o;
}

// The options with --faults parsed into them.
absl::StatusOr<proxy::EvalOptions> ParseEvalArgs(const ProxyEvalArgs& args) {
  proxy::EvalOptions eval = args.eval;
  if (!args.faults.empty()) {
    eval.faults.clear();
    for (const std::string& f : args.faults) {
      MOERR_ASSIGN_OR_RETURN(const moe::FaultKind kind, moe::ParseFault(f));
      eval.faults.push_back(kind);
    }
  }
  return eval;
}

// The names proxy-eval writes in its work directory: the --json report too
// when it goes there (-o DIR --json DIR/report.json, however spelled).
std::vector<std::string> OwnFiles(const std::string& json_path, const std::string& out_dir) {
  std::vector<std::string> own = {"warmup", "healthy.moerr", "proxy", "fault.moerr", "proxy-replay.moerr", "proxies"};
  if (!json_path.empty()) {
    namespace fs = std::filesystem;
    std::error_code a, b, c, d;
    const fs::path json = fs::absolute(json_path, a), dir = fs::absolute(out_dir, b);
    const fs::path json_dir = fs::weakly_canonical(json.parent_path(), c);
    if (!a && !b && !c && json_dir == fs::weakly_canonical(dir, d) && !d) own.push_back(json.filename().string());
  }
  return own;
}

// The model: "preset `fine` (qwen3_moe)", or "--hf-config FILE (qwen3_moe)".
std::string ModelText(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  if (eval.hf_config.empty()) return absl::StrFormat("preset `%s` (%s)", report.preset, report.family);
  return absl::StrFormat("--hf-config %s (%s)", report.preset, report.family);
}

// Where the static proxies were kept as HF checkpoints, and the warm original.
void PrintKeptCheckpoints(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  std::printf("\n%zu static proxies kept as HF checkpoints (transformers' from_pretrained, moerr forward "
              "--checkpoint) in %s/proxies/<kept>of<E>-<method>[-heal<N>]; the warm original: %s\n",
              report.rows.size(), eval.out_dir.c_str(), report.warm_checkpoint.c_str());
}

// "cluster", or "cluster +heal N" for a healed row.
std::string MethodCell(const proxy::EvalRow& r) {
  return r.heal_steps > 0 ? absl::StrFormat("%s +heal %d", r.method, r.heal_steps) : r.method;
}

// The trends (EMA-smoothed correlation; slope-sign agreement; drift ratio)
// and the fault responses of every row.
void PrintDynamicsTable(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  std::printf("\ntrends over %lld healthy RL steps at trainer seed 5: smoothed r (EMA span %lld steps), slope-sign "
              "agreement over windows of %lld steps, drift ratio (proxy / original); fault response: each fault "
              "injected after %lld healthy steps, %lld steps more (%lld for a fault whose onset comes from the "
              "dynamics), at each of %lld trainer seeds and compared seed by seed (counts of faults x seeds)\n\n",
              static_cast<long long>(eval.steps), static_cast<long long>(eval.trend.ema_window),
              static_cast<long long>(eval.trend.slope_window), static_cast<long long>(eval.response_at),
              static_cast<long long>(eval.response_steps), static_cast<long long>(eval.dynamics_steps),
              static_cast<long long>(eval.trainer_seeds));
  std::printf("| keep | method | smoothed r(reward) | smoothed r(loss) | smoothed r(KL) | smoothed r(grad norm) | "
              "slope agr. (reward/loss/KL/grad) | drift ratio (reward/loss/KL/grad) | replayed smoothed r "
              "(loss/KL/grad) | responding alike | magnitude within 2x | same outcome | onset diff |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const proxy::EvalRow& r : report.rows) {
    int64_t alike = 0, within = 0, same = 0, onset_cases = 0;
    double onset = 0;
    for (const proxy::FaultResponseRow& f : r.responses) {
      alike += f.comparison.same_onset_presence;
      within += f.comparison.magnitude_within_2x;
      same += f.comparison.same_outcome;
      if (f.comparison.both_respond) onset += std::abs(double(f.comparison.onset_delta)), ++onset_cases;
    }
    const long long n = static_cast<long long>(r.responses.size());
    std::printf("| %lld/%lld | %s | %s | %s | %s | %s | %s/%s/%s/%s | %s/%s/%s/%s | %s/%s/%s | %lld/%lld | %lld/%lld | "
                "%lld/%lld | %s |\n",
                static_cast<long long>(r.kept), static_cast<long long>(report.experts), MethodCell(r).c_str(),
                Cell(r.trend_reward.smoothed_corr).c_str(), Cell(r.trend_loss.smoothed_corr).c_str(),
                Cell(r.trend_kl.smoothed_corr).c_str(), Cell(r.trend_grad_norm.smoothed_corr).c_str(),
                Cell(r.trend_reward.slope_sign_agreement, 2).c_str(), Cell(r.trend_loss.slope_sign_agreement, 2).c_str(),
                Cell(r.trend_kl.slope_sign_agreement, 2).c_str(), Cell(r.trend_grad_norm.slope_sign_agreement, 2).c_str(),
                Cell(r.trend_reward.drift_ratio, 2).c_str(), Cell(r.trend_loss.drift_ratio, 2).c_str(),
                Cell(r.trend_kl.drift_ratio, 2).c_str(), Cell(r.trend_grad_norm.drift_ratio, 2).c_str(),
                Cell(r.replayed_trend_loss.smoothed_corr).c_str(), Cell(r.replayed_trend_kl.smoothed_corr).c_str(),
                Cell(r.replayed_trend_grad_norm.smoothed_corr).c_str(), static_cast<long long>(alike), n,
                static_cast<long long>(within), n, static_cast<long long>(same), n,
                Cell(onset_cases > 0 ? onset / onset_cases : NAN, 2).c_str());
  }
}

// "in band / r proxy / r one more seed" of one metric.
std::string BandCell(const proxy::SeedBand& b) {
  return absl::StrFormat("%s / %s / %s", Cell(100 * b.in_band, 0, "%"), Cell(b.r_proxy), Cell(b.r_extra_seed));
}

// "noise @KL 0.00246 (rel 0.0859)": a noise row by the KL it reached and
// its size; by the KL it was asked for when the match failed.
std::string NoiseCell(const proxy::NoiseRow& n) {
  if (!n.error.empty()) return absl::StrFormat("noise @KL %.3g: not matched", n.target_kl);
  return absl::StrFormat("noise @KL %.3g (rel %.3g)", n.kl, n.rel);
}

// The own-rollout dynamics over the trainer seeds against the original's
// band (proxy/seed_dynamics.h), each row followed by its matched-KL noise
// row (proxy/noise_row.h), and whether each meets the goal.
void PrintSeedBandTable(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  std::printf("\ndynamics over %lld trainer seeds (smoothed, EMA span %lld): share of steps in the original's band "
              "(mean +- 2 sd), leave-one-seed-out r of the proxy / of one more original seed\n",
              static_cast<long long>(eval.trainer_seeds), static_cast<long long>(eval.trend.ema_window));
  if (eval.noise_rows) {
    std::printf("under each row, its noise row: the original with weight noise (noise seed %llu) matched to the "
                "row's logit KL within %gx on the same held-out batch, over the same trainer seeds\n",
                static_cast<unsigned long long>(proxy::kNoiseRowSeed), proxy::MatchOptions().factor);
  }
  std::printf("\n");
  if (eval.trainer_seeds < 2) {
    std::printf("one trainer seed has no spread to judge by: --trainer-seeds 2 or more for the band and the goal\n");
    return;
  }
  std::printf("| keep | method | reward: in band / r proxy / r seed | loss | KL | grad norm |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const proxy::EvalRow& r : report.rows) {
    std::printf("| %lld/%lld | %s | %s | %s | %s | %s |\n", static_cast<long long>(r.kept),
                static_cast<long long>(report.experts), MethodCell(r).c_str(), BandCell(r.seed_band.reward).c_str(),
                BandCell(r.seed_band.loss).c_str(), BandCell(r.seed_band.kl).c_str(),
                BandCell(r.seed_band.grad_norm).c_str());
    if (!r.noise) continue;
    const proxy::SeedBands& b = r.noise->seed_band;
    std::printf("| %lld/%lld | %s | %s | %s | %s | %s |\n", static_cast<long long>(r.kept),
                static_cast<long long>(report.experts), NoiseCell(*r.noise).c_str(), BandCell(b.reward).c_str(),
                BandCell(b.loss).c_str(), BandCell(b.kl).c_str(), BandCell(b.grad_norm).c_str());
  }
  std::printf("\ngoal: reward, KL and grad norm in the band on >= %.0f%% of steps, and r proxy >= r seed\n",
              100 * proxy::kInBandGoal);
  for (const proxy::EvalRow& r : report.rows) {
    const std::vector<std::string> shortfalls = proxy::SeedGoalShortfalls(r.seed_band);
    const std::string verdict = shortfalls.empty() ? "holds" : "not met: " + absl::StrJoin(shortfalls, "; ");
    std::printf("%lld/%lld %s: %s\n", static_cast<long long>(r.kept), static_cast<long long>(report.experts),
                MethodCell(r).c_str(), verdict.c_str());
    if (!r.noise) continue;
    const std::vector<std::string> noise = proxy::SeedGoalShortfalls(r.noise->seed_band);
    const std::string noise_verdict = !r.noise->error.empty() ? r.noise->error
                                      : noise.empty()         ? "holds too"
                                                              : "not met: " + absl::StrJoin(noise, "; ");
    std::printf("  its %s: %s\n", NoiseCell(*r.noise).c_str(), noise_verdict.c_str());
  }
}

// Each row's fault-response error and random pruning's minus it
// (proxy/response_error.h): > 0, nearer the original's response than random.
void PrintVersusRandomTable(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  std::printf("\nfault response against random pruning: onset error = mean |proxy onset - original onset| over the "
              "fault cases (faults x trainer seeds; a missing onset counted one step past the run), magnitude error = "
              "mean |log2 ratio| of the grad-norm spike, loss-scale drops and reward collapse (ratios capped at %gx); "
              "vs random = random's error minus the method's at the same keep (> 0: better than random)\n\n",
              proxy::kMagnitudeRatioCap);
  if (std::find(eval.methods.begin(), eval.methods.end(), "random") == eval.methods.end()) {
    std::printf("random is not among --methods: the vs-random columns need it (add random to --methods)\n\n");
  }
  std::printf("| keep | method | onset error | magnitude error | onset vs random | magnitude vs random |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const proxy::EvalRow& r : report.rows) {
    std::printf("| %lld/%lld | %s | %s | %s | %s | %s |\n", static_cast<long long>(r.kept),
                static_cast<long long>(report.experts), MethodCell(r).c_str(), Cell(r.response_error.onset, 2).c_str(),
                Cell(r.response_error.magnitude, 2).c_str(), Cell(r.onset_vs_random, 2).c_str(),
                Cell(r.magnitude_vs_random, 2).c_str());
  }
}

// --static-only: static fidelity and the parameter ratio of every row.
void PrintStaticTable(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  std::printf("%s, %lld experts per MoE layer; original accuracy %.3f (256 problems, sample seed %llu); "
              "static fidelity only\n\n",
              ModelText(report, eval).c_str(), static_cast<long long>(report.experts),
              report.original_accuracy, static_cast<unsigned long long>(eval.sample_seed));
  std::printf("| keep | method | hidden cos | logit KL | routing agr. | accuracy | params ratio |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const proxy::EvalRow& r : report.rows) {
    std::printf("| %lld/%lld | %s | %s | %s | %s | %s | %s |\n", static_cast<long long>(r.kept),
                static_cast<long long>(report.experts), MethodCell(r).c_str(), Cell(r.hidden_cosine).c_str(),
                Cell(r.logit_kl, 4).c_str(), Cell(r.routing_agreement).c_str(), Cell(r.accuracy).c_str(),
                Cell(r.params_ratio, 2, "x").c_str());
  }
}

void PrintTable(const proxy::EvalReport& report, const proxy::EvalOptions& eval) {
  std::printf("%s, %lld experts per MoE layer; original accuracy %.3f; %lld healthy RL steps (r: trainer seed 5); "
              "faults x %lld seeds; peak memory in micro-batches of %lld sequences\n\n",
              ModelText(report, eval).c_str(), static_cast<long long>(report.experts), report.original_accuracy,
              static_cast<long long>(eval.steps), static_cast<long long>(eval.seeds),
              static_cast<long long>(eval.memory_micro_batch));
  std::printf("experts before -> after the warm-up (64 task sequences): routing entropy %.3f -> %.3f, load entropy "
              "%.3f -> %.3f, mean pairwise cosine distance of expert outputs %.3f -> %.3f\n\n",
              report.initial.routing_entropy, report.warm.routing_entropy, report.initial.load_entropy,
              report.warm.load_entropy, report.initial.output_cosine_distance, report.warm.output_cosine_distance);
  std::printf("| keep | method | hidden cos | logit KL | routing agr. | accuracy | r(loss) | r(reward) | r(KL) | "
              "r(grad norm) | replayed r(loss) | replayed r(KL) | replayed r(grad norm) | faults reproduced | "
              "localised | early | onset diff | params ratio | peak memory ratio | whole-batch peak ratio | step-time ratio |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const proxy::EvalRow& r : report.rows) {
    std::printf("| %lld/%lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %lld/%lld | %lld/%lld | "
                "%lld/%lld | %s | %s | %s | %s | %s |\n",
                static_cast<long long>(r.kept), static_cast<long long>(report.experts), MethodCell(r).c_str(),
                Cell(r.hidden_cosine).c_str(), Cell(r.logit_kl, 4).c_str(), Cell(r.routing_agreement).c_str(),
                Cell(r.accuracy).c_str(), Cell(r.corr_loss).c_str(), Cell(r.corr_reward).c_str(),
                Cell(r.corr_kl).c_str(), Cell(r.corr_grad_norm).c_str(), Cell(r.replayed_corr_loss).c_str(),
                Cell(r.replayed_corr_kl).c_str(), Cell(r.replayed_corr_grad_norm).c_str(),
                static_cast<long long>(r.reproduced), static_cast<long long>(r.cases),
                static_cast<long long>(r.localised), static_cast<long long>(r.cases), static_cast<long long>(r.early),
                static_cast<long long>(r.cases), Cell(r.onset_delta, 2).c_str(),
                Cell(r.params_ratio, 2, "x").c_str(), Cell(r.peak_memory_ratio, 2, "x").c_str(),
                Cell(r.whole_batch_peak_memory_ratio, 2, "x").c_str(), Cell(r.step_time_ratio, 2, "x").c_str());
  }
}

void PrintRanking(const proxy::MethodRanking& ranking) {
  std::printf("\nmethod ranking by the rule: %s\n", proxy::RankingRuleText().c_str());
  for (const std::string& line : proxy::RankingLines(ranking)) std::printf("%s\n", line.c_str());
}

// --pool A.json B.json ...: the rule over earlier reports' rows
// (proxy/ranking_merge.h); every option but --json is refused.
ExitOr RunPool(const ProxyEvalArgs& args, const CLI::App& cmd) {
  for (const CLI::Option* option : cmd.get_options()) {
    const std::string name = option->get_name();
    if (option->count() > 0 && name != "--pool" && name != "--json") {
      return absl::InvalidArgumentError(
          absl::StrFormat("proxy-eval --pool runs nothing and does not use %s", name));
    }
  }
  MOERR_RETURN_IF_ERROR(CheckDistinctInputs(args.pool));
  if (!args.json.empty()) MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.json, args.pool));
  std::vector<proxy::RankingPart> parts;
  for (const std::string& path : args.pool) {
    MOERR_ASSIGN_OR_RETURN(proxy::RankingPart part, proxy::ReadRankingPart(path));
    parts.push_back(std::move(part));
  }
  MOERR_ASSIGN_OR_RETURN(const proxy::MethodRanking ranking, proxy::MergeRankings(parts));
  PrintRanking(ranking);
  if (!args.json.empty()) {
    const llvm::json::Value json = proxy::MergedRankingJson(parts, ranking);
    MOERR_RETURN_IF_ERROR(formats::WriteJsonFile(args.json, json, /*overwrite=*/true));
  }
  return kExitOk;
}

ExitOr RunProxyEval(const ProxyEvalArgs& args, const CLI::App& cmd) {
  if (!args.pool.empty()) return RunPool(args, cmd);
  if (args.eval.out_dir.empty()) return absl::InvalidArgumentError("proxy-eval needs -o DIR (or --pool REPORT...)");
  if (args.ranks > 0) {
    MOERR_ASSIGN_OR_RETURN(const world::RankCostOptions o, RankCostOptionsOf(args, cmd));
    std::vector<std::string> own = OwnFiles(args.json, o.out_dir);  // and a directory per fault
    own.insert(own.end(), o.faults.begin(), o.faults.end());
    MOERR_RETURN_IF_ERROR(ClaimWorkDir(o.out_dir, "proxy-eval", own));
    return world::RunRankCost(o, args.json);
  }
  for (const char* ranks_only : {"--child-timeout", "--rounds"}) {
    if (cmd.get_option(ranks_only)->count() > 0) {
      return absl::InvalidArgumentError(absl::StrFormat("proxy-eval: %s is for --ranks", ranks_only));
    }
  }
  for (const char* unused : {"--seeds", "--steps", "--faults", "--memory-micro-batch", "--ema-window",
                             "--slope-window", "--response-at", "--response-steps", "--dynamics-steps",
                             "--trainer-seeds", "--noise-rows"}) {
    if (args.eval.static_only && cmd.get_option(unused)->count() > 0) {
      return absl::InvalidArgumentError(absl::StrFormat("proxy-eval --static-only does not use %s", unused));
    }
  }
  for (const char* model : {"--preset", "--family"}) {
    if (!args.eval.hf_config.empty() && cmd.get_option(model)->count() > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "proxy-eval: --hf-config and %s are exclusive (the config file names the model and its family)", model));
    }
  }
  MOERR_ASSIGN_OR_RETURN(const proxy::EvalOptions eval, ParseEvalArgs(args));
  if (!eval.hf_config.empty()) {  // before the work directory is made
    MOERR_RETURN_IF_ERROR(proxy::ReadHfConfigFile(eval.hf_config, moe::AdditionTask::kVocab).status());
  }
  MOERR_RETURN_IF_ERROR(ClaimWorkDir(eval.out_dir, "proxy-eval", OwnFiles(args.json, eval.out_dir)));
  PhasedProgress bar;
  auto report = proxy::EvaluateProxies(eval, [&](const std::string& phase, int64_t done, int64_t total) {
    bar.Update(phase, done, total);
  });
  bar.Finish();
  if (!report.ok()) return report.status();
  if (eval.static_only) {
    PrintStaticTable(*report, eval);
  } else {
    PrintTable(*report, eval);
    PrintDynamicsTable(*report, eval);
    PrintSeedBandTable(*report, eval);
    PrintVersusRandomTable(*report, eval);
  }
  PrintKeptCheckpoints(*report, eval);
  if (report->ranking) PrintRanking(*report->ranking);
  if (!args.json.empty()) {
    MOERR_RETURN_IF_ERROR(formats::WriteJsonFile(args.json, proxy::ToJson(*report), /*overwrite=*/true));
  }
  return kExitOk;
}

}  // namespace

namespace {

// The options of the dynamics, the fault responses and healing.
void AddDynamicsOptions(CLI::App* cmd, ProxyEvalArgs& opts) {
  cmd->add_option("--memory-micro-batch", opts.eval.memory_micro_batch,
                  "Sequences per training forward in the peak-memory steps (the whole-batch peak is reported too)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--ema-window", opts.eval.trend.ema_window, "EMA span of the smoothed trends, steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--slope-window", opts.eval.trend.slope_window, "Steps per window of the trend slopes")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--response-at", opts.eval.response_at, "Healthy steps before each fault is injected (fault response)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--response-steps", opts.eval.response_steps, "Steps after the fault is injected")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--dynamics-steps", opts.eval.dynamics_steps,
                  "For a fault whose onset comes from the dynamics (lr-divergence, router-collapse-free, "
                  "loss-scale-growth, trained-precision): steps after it is injected in the fault response, and steps "
                  "recorded per fault case")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 10));
  cmd->add_option("--heal", opts.eval.heal_steps,
                  "Also evaluate every configuration with its proxies healed for N distillation steps (moerr proxy "
                  "--heal), beside the unhealed rows; 0: off")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
}

// The options of the cost on fewer ranks (--ranks).
void AddRanksOptions(CLI::App* cmd, ProxyEvalArgs& opts) {
  cmd->add_option("--ranks", opts.ranks,
                  "N > 1: the cost on fewer ranks instead: for each fault, train an N-rank expert-parallel step "
                  "(EP N), replay it on its N ranks and each proxy (--keep) on its fewer ranks, as child processes "
                  "of this command; devices, step time per rank and device time per step (the ranks' CPU seconds), "
                  "and whether the fault reproduces and is localised on M ranks. Uses --preset (wide-ep is the one "
                  "made for it, and its default with --ranks; --warmup-steps defaults to 20), --keep, --faults, "
                  "--child-timeout, --rounds, -o, --json, and refuses the other options")
      ->check(CLI::Range(int64_t{2}, int64_t{256}));
  cmd->add_option("--rounds", opts.on_ranks.rounds,
                  "With --ranks: replays of each step, the original's and each proxy's interleaved; each cost is "
                  "their median")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100}));
  cmd->add_option("--child-timeout", opts.on_ranks.child_timeout_s,
                  "With --ranks: seconds each child command (train, replay, proxy) may run before it is stopped and "
                  "reported; train's --deadline too")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
}

}  // namespace

void AddProxyEvalCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ProxyEvalArgs>();
  CLI::App* cmd = app.add_subcommand(
      "proxy-eval", "Measure proxies against the original: static fidelity, RL dynamics (per step and as trends), "
                    "fault response and reproduction, and cost, for each kept fraction and method, and which method is best by "
                    "a stated rule; with --pool, that rule over earlier reports together");
  cmd->add_option("-o,--output", opts->eval.out_dir,
                  "Work directory (its warm-up of each preset, family and length is reused); required unless --pool");
  cmd->add_option("--preset", opts->eval.preset,
                  "Model size, one of:\n" + std::string(absl::StripTrailingAsciiWhitespace(moe::PresetHelp())))
      ->capture_default_str()
      ->check(CLI::IsMember(moe::PresetNames()));
  cmd->add_option("--hf-config", opts->eval.hf_config,
                  "A transformers config.json (Qwen2-MoE, Qwen3-MoE, DeepSeek-V3, Mixtral) to build the model from "
                  "instead of --preset and --family; warmed up as a preset is, cached by the file's content");
  AddParsedOption(
      cmd, "--family",
      [opts](const std::string& text) -> absl::Status {
        MOERR_ASSIGN_OR_RETURN(opts->eval.family, moe::ParseFamily(text));
        return absl::OkStatus();
      },
      "Model family: qwen2_moe, qwen3_moe, deepseek_v3, mixtral", moe::FamilyName(opts->eval.family));
  cmd->add_option("--warmup-steps", opts->eval.warmup_steps, "Supervised warm-up steps")->capture_default_str();
  cmd->add_option("--steps", opts->eval.steps, "Healthy RL steps for the dynamics")->capture_default_str();
  cmd->add_option("--seeds", opts->eval.seeds, "Seeds per fault")->capture_default_str();
  cmd->add_option("--trainer-seeds", opts->eval.trainer_seeds,
                  "Trainer seeds (5, 6, ...) of the healthy runs of the original and each proxy, judged against the "
                  "original's band over them, and of the fault responses; the per-step r, the trends and the "
                  "replayed run are of seed 5")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 10));
  cmd->add_flag("--noise-rows,!--no-noise-rows", opts->eval.noise_rows,
                "Beside each row, the original with weight noise matched to its logit KL, run over the same trainer "
                "seeds and judged by the same band (default on; --no-noise-rows: off; skipped with --trainer-seeds 1, "
                "which has no band)");
  cmd->add_option_function<std::vector<std::string>>(
         "--keep",
         [opts](const std::vector<std::string>& keeps) {
           const absl::Status parsed = ParseKeeps(keeps, *opts);
           if (!parsed.ok()) throw CLI::ValidationError("--keep", std::string(parsed.message()));
         },
         "Kept fractions")
      ->default_str(absl::StrJoin(opts->on_ranks.keeps, " "));
  cmd->add_option("--methods", opts->eval.methods, "cluster, cluster-unforced, cluster-frequency, frequency, random, reap, hc-medoid");
  cmd->add_option("--faults", opts->faults,
                  "Faults (default: the whole catalogue; with --ranks, the faults that fail at once, without the "
                  "dynamics faults lr-divergence, router-collapse-free, loss-scale-growth, trained-precision)");
  AddDynamicsOptions(cmd, *opts);
  cmd->add_flag("--static-only", opts->eval.static_only,
                "Static fidelity only (hidden cosine, logit KL, routing agreement, accuracy): no RL dynamics, fault "
                "response or reproduction; minutes instead of an hour, to compare methods");
  cmd->add_option("--sample-seed", opts->eval.sample_seed,
                  "Seed of the static fidelity's samples: the healthy step the proxies are built from, their "
                  "calibration batch, the held-out batch and the 256 accuracy problems (the original's too)")
      ->capture_default_str();
  cmd->add_option("--json", opts->json, "Also write the report as JSON here");
  cmd->add_option("--pool", opts->pool,
                  "Run nothing: rank the methods of earlier --json reports together, one table measured in pieces "
                  "(each run with random; refused unless the reports are of one model and run options, a report "
                  "without recorded options pooled unchecked and said); with --json, the pooled ranking");
  AddRanksOptions(cmd, *opts);
  OnRun(cmd, exit_code, [opts, cmd] { return RunProxyEval(*opts, *cmd); });
}

}  // namespace moerr::tools
