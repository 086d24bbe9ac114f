#include "proxy/proxy_eval.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/json_number.h"
#include "moe/checkpoint.h"
#include "moe/warmup.h"
#include "proxy/hf_config_file.h"
#include "proxy/proxy_builder.h"
#include "proxy/surgery.h"
#include "proxy/weight_noise.h"
#include "recorder/recorder.h"
#include "replayer/model_replay.h"
#include "replayer/step_failure.h"
#include "replayer/world_failure.h"
#include "support/check.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::proxy {
namespace {

// How step `step` of `reader` shows `fault`: its failure of the fault's kind
// and rule (replayer/world_failure.h, the table the multi-rank verdict
// judges by), of several the largest measure; nullopt when none.
absl::StatusOr<std::optional<replayer::Failure>> FaultFailure(const formats::BundleReader& reader, int64_t step,
                                                              moe::FaultKind fault) {
  MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(reader, step));
  MOERR_ASSIGN_OR_RETURN(const std::vector<replayer::Failure> all,
                         replayer::FailuresOf(reader, step, trace, replayer::FailureKindOfFault(fault)));
  std::optional<replayer::Failure> out;
  for (const replayer::Failure& f : all) {  // worst first: the first of the largest measure
    if (f.rule != replayer::FailureRuleOfFault(fault)) continue;
    if (!out || f.measure.value_or(0) > out->measure.value_or(0)) out = f;
  }
  return out;
}

// Steps after injection a fault is followed for: longer for one whose
// onset comes from the dynamics.
int64_t StepsAfter(moe::FaultKind fault, const EvalOptions& options) {
  return moe::OnsetFromDynamics(fault) ? options.dynamics_steps : options.response_steps;
}

void StaticFidelity(moe::MoeTransformer& original, moe::MoeTransformer& proxy, const std::vector<LayerPlan>& plans,
                    const at::Tensor& tokens, EvalRow& row) {
  at::DisableRecordFunctionGuard no_record;
  torch::NoGradGuard no_grad;
  Trajectory::Decisions original_calls, proxy_calls;  // one forward each
  DecisionLog co, cp;
  co.step = &original_calls, cp.step = &proxy_calls;
  original->SetRoutingObserver(&co);
  proxy->SetRoutingObserver(&cp);
  const moe::ForwardOutput fo = original->Forward(tokens, true), fp = proxy->Forward(tokens, true);
  original->SetRoutingObserver(nullptr);
  proxy->SetRoutingObserver(nullptr);
  double cosine = 0;
  for (size_t l = 0; l < fo.hidden.size(); ++l) {
    cosine += at::cosine_similarity(fo.hidden[l].to(at::kDouble), fp.hidden[l].to(at::kDouble), -1).mean().item<double>();
  }
  row.hidden_cosine = cosine / fo.hidden.size();
  row.logit_kl = LogitKl(fo.logits, fp.logits);
  double agree = 0, slots = 0;
  for (const LayerPlan& plan : plans) {
    const at::Tensor a = original_calls.at(plan.layer).back().first, b = proxy_calls.at(plan.layer).back().first;
    std::vector<int64_t> index(plan.medoid_of.size(), -1);
    for (size_t i = 0; i < plan.kept.size(); ++i) index[plan.kept[i]] = static_cast<int64_t>(i);
    std::vector<int64_t> lookup(plan.medoid_of.size());
    for (size_t e = 0; e < plan.medoid_of.size(); ++e) lookup[e] = index[plan.medoid_of[e]];
    const at::Tensor mapped = at::tensor(lookup, at::kLong).index_select(0, a.reshape({-1})).view(a.sizes());
    agree += b.unsqueeze(2).eq(mapped.unsqueeze(1)).any(2).sum().item<double>();
    slots += b.numel();
  }
  row.routing_agreement = slots > 0 ? agree / slots : 1.0;
}

ProxyOptions Configure(double keep, const std::string& method, const std::string& out_dir, int64_t step,
                       const std::string& source, uint64_t seed) {
  ProxyOptions o;
  o.cluster.seed = seed;  // the calibration batch, and random's choice
  o.keep_fraction = keep;
  o.step = step;
  o.out_dir = out_dir;
  o.overwrite = true;
  o.source = source;
  o.cluster.force = method == "cluster" || method == "cluster-frequency";  // the baselines run unforced
  o.cluster.method = ParseMethod(method == "cluster-unforced" ? "cluster" : method).value();
  return o;
}

// Known methods, a config file moerr can build, and the output directories made.
absl::Status Prepare(const EvalOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required (-o DIR)");
  for (const std::string& m : options.methods) {
    if (m != "cluster-unforced" && !ParseMethod(m).ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unknown method \"%s\" (cluster, cluster-unforced, cluster-frequency, frequency, random, reap, hc-medoid)", m));
    }
  }
  if (!options.hf_config.empty()) {
    MOERR_RETURN_IF_ERROR(ReadHfConfigFile(options.hf_config, moe::AdditionTask::kVocab).status());
  }
  for (const std::string& dir : {options.out_dir, options.out_dir + "/warmup", options.out_dir + "/proxies"}) {
    MOERR_RETURN_IF_ERROR(MakeDirectory(dir));
  }
  return absl::OkStatus();
}

// The model's config and the directory its warm-up is cached in: a
// preset's, OUT/warmup/PRESET-FAMILY-STEPS, or a config file's, keyed by its
// bytes, OUT/warmup/hf-DIGEST-STEPS (another file never reuses it). With a
// file, `report`'s preset and family are the file and the family it names.
absl::StatusOr<std::pair<moe::MoeConfig, std::string>> WarmSource(const EvalOptions& options, EvalReport& report) {
  if (options.hf_config.empty()) {
    MOERR_ASSIGN_OR_RETURN(moe::MoeConfig config, moe::Preset(options.preset, options.family));
    return std::make_pair(config, absl::StrFormat("%s/warmup/%s-%s-%d", options.out_dir, options.preset,
                                                  moe::FamilyName(options.family), options.warmup_steps));
  }
  MOERR_ASSIGN_OR_RETURN(HfConfigFile file, ReadHfConfigFile(options.hf_config, moe::AdditionTask::kVocab));
  report.preset = options.hf_config;
  report.family = moe::FamilyName(file.config.family);
  return std::make_pair(file.config,
                        absl::StrFormat("%s/warmup/hf-%s-%d", options.out_dir, file.digest, options.warmup_steps));
}

// The warm model, cached across runs of the same model and warm-up length
// (what it was made from is in its directory's name, `report`'s
// warm_checkpoint). `report`'s expert diversity of the model before (the same
// seeded initialisation) and after the warm-up, on 64 task sequences.
absl::StatusOr<moe::MoeTransformer> WarmModel(const EvalOptions& options, const EvalProgress& progress,
                                              EvalReport& report) {
  MOERR_ASSIGN_OR_RETURN(const auto source, WarmSource(options, report));
  const moe::MoeConfig& config = source.first;
  const std::string& warm_dir = source.second;
  report.warm_checkpoint = warm_dir;
  std::mt19937_64 rng(7);
  const moe::AdditionTask::Batch calib = moe::AdditionTask().Sample(64, rng);
  const at::Tensor calibration = at::cat({calib.prompts, calib.answers}, 1);
  torch::manual_seed(0);
  moe::MoeTransformer warm(config);
  report.initial = MeasureExpertDiversity(warm, calibration);
  if (auto cached = moe::LoadCheckpoint(warm_dir); cached.ok() && (*cached)->config().num_experts > 0) {
    report.warm = MeasureExpertDiversity(*cached, calibration);
    return *cached;
  }
  moe::WarmupOptions w;
  w.steps = options.warmup_steps;
  moe::Warmup(warm, moe::AdditionTask(), w, [&](int64_t s, double) { progress("warm-up", s + 1, w.steps); });
  MOERR_RETURN_IF_ERROR(Annotate(moe::SaveCheckpoint(warm, warm_dir, true), warm_dir));
  report.warm = MeasureExpertDiversity(warm, calibration);
  return warm;
}

// What every configuration is compared with: the warm model's healthy
// recorded step (the static proxies are built from it), a held-out batch,
// its RL trajectory and its micro-batched peak memory.
struct Baseline {
  std::string healthy_path;
  std::unique_ptr<formats::BundleReader> healthy;
  at::Tensor tokens;  // [64, S] held-out sequences
  Trajectory trajectory;  // at the first trainer seed (5)
  std::vector<Trajectory> seeds;  // at each trainer seed (TrainerSeeds), metrics only
  int64_t peak_bytes = 0;
  // The original's, per fault, per trainer seed in TrainerSeeds order.
  std::map<moe::FaultKind, std::vector<FaultResponse>> responses;
};

absl::StatusOr<Baseline> MeasureBaseline(const moe::MoeTransformer& warm, const EvalOptions& options) {
  Baseline b;
  b.healthy_path = options.out_dir + "/healthy.moerr";
  MOERR_RETURN_IF_ERROR(
      Annotate(RecordHealthyStep(warm, b.healthy_path, options.sample_seed), b.healthy_path));
  MOERR_ASSIGN_OR_RETURN(b.healthy, formats::BundleReader::Open(b.healthy_path));
  std::mt19937_64 rng(99 + options.sample_seed);
  const moe::AdditionTask::Batch held_out = moe::AdditionTask().Sample(64, rng);
  b.tokens = at::cat({held_out.prompts, held_out.answers}, 1);
  if (options.static_only) return b;
  b.trajectory = Train(warm, options.steps, kFirstTrainerSeed);
  b.seeds = TrainSeeds(warm, options.steps, options.trainer_seeds, &b.trajectory);
  b.peak_bytes = MicroBatchedPeakMemory(warm, options.memory_micro_batch);
  for (moe::FaultKind fault : options.faults) {
    for (uint64_t seed : TrainerSeeds(options.trainer_seeds)) {
      MOERR_ASSIGN_OR_RETURN(const auto run,
                             FaultResponseRun(warm, fault, options.response_at, StepsAfter(fault, options), seed));
      b.responses[fault].push_back(MeasureResponse(run, options.response_at));
    }
  }
  return b;
}

// Copies the files of `built`'s checkpoint and its cluster map into `dir`,
// which is emptied first: an HF checkpoint (config.json, model.safetensors)
// that the next build into OUT/proxy does not overwrite.
absl::Status KeepCheckpoint(const ProxyReport& built, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::remove_all(dir, error);
  if (!error) fs::create_directories(dir, error);
  std::vector<fs::path> files = {built.cluster_map};
  for (fs::directory_iterator it(built.checkpoint, error), end; !error && it != end; it.increment(error)) {
    files.push_back(it->path());
  }
  for (size_t i = 0; i < files.size() && !error; ++i) {
    fs::copy_file(files[i], fs::path(dir) / files[i].filename(), fs::copy_options::overwrite_existing, error);
  }
  if (error) return absl::UnavailableError(absl::StrFormat("cannot keep the proxy in %s: %s", dir, error.message()));
  return absl::OkStatus();
}

// Builds the proxy of step `step` of `reader` for `row`'s configuration,
// healed when the row is. With `kept` (the row's static proxy), the proxy is
// also kept as OUT/proxies/<kept>of<E>-<method>[-heal<N>] (KeepCheckpoint),
// named in `*kept`.
absl::StatusOr<ProxyReport> BuildRowProxy(const formats::BundleReader& reader, const std::string& path, int64_t step,
                                          const EvalRow& row, const EvalOptions& options, HealReport* healed = nullptr,
                                          std::string* kept = nullptr) {
  MOERR_ASSIGN_OR_RETURN(ProxyReport built,
                         BuildProxy(reader, Configure(row.keep, row.method, options.out_dir + "/proxy", step, path,
                                                      options.sample_seed)));
  if (row.heal_steps > 0) {
    HealOptions heal;
    heal.steps = row.heal_steps;
    MOERR_ASSIGN_OR_RETURN(HealReport report, HealProxy(reader, built, heal, path));
    if (healed) *healed = std::move(report);
  }
  if (kept != nullptr) {
    const std::string heal = row.heal_steps > 0 ? absl::StrFormat("-heal%d", row.heal_steps) : "";
    *kept = absl::StrFormat("%s/proxies/%dof%d-%s%s", options.out_dir, built.kept, built.experts, row.method, heal);
    MOERR_RETURN_IF_ERROR(KeepCheckpoint(built, *kept));
  }
  return built;
}

// The trends of `proxy`'s trajectory against `original`'s.
void CompareTrends(const Trajectory& original, const Trajectory& t, bool replayed, const TrendOptions& o,
                   EvalRow& row) {
  (replayed ? row.replayed_trend_loss : row.trend_loss) = CompareTrend(original.loss, t.loss, o);
  (replayed ? row.replayed_trend_kl : row.trend_kl) = CompareTrend(original.kl, t.kl, o);
  (replayed ? row.replayed_trend_grad_norm : row.trend_grad_norm) = CompareTrend(original.grad_norm, t.grad_norm, o);
  if (!replayed) row.trend_reward = CompareTrend(original.reward, t.reward, o);
}

// Each fault injected into `proxy` at each trainer seed, compared with the
// original's response at the same seed, into `row.responses`.
absl::Status RespondToFaults(const moe::MoeTransformer& proxy, const Baseline& base, const EvalOptions& options,
                             EvalRow& row) {
  const std::vector<uint64_t> seeds = TrainerSeeds(options.trainer_seeds);
  for (const auto& [fault, responses] : base.responses) {
    const int64_t after = StepsAfter(fault, options);
    for (size_t i = 0; i < seeds.size(); ++i) {
      MOERR_ASSIGN_OR_RETURN(const auto run, FaultResponseRun(proxy, fault, options.response_at, after, seeds[i]));
      FaultResponseRow r{fault, responses.at(i), MeasureResponse(run, options.response_at), {},
                         options.response_at + after, seeds[i]};
      r.comparison = CompareResponse(r.original, r.proxy);
      row.responses.push_back(std::move(r));
    }
  }
  return absl::OkStatus();
}

// Static fidelity, dynamics, fault response and cost of one kept fraction
// and method (healed for `heal_steps` > 0).
absl::StatusOr<EvalRow> EvaluateConfiguration(moe::MoeTransformer& warm, const Baseline& base, double keep,
                                              const std::string& method, int64_t heal_steps,
                                              const EvalOptions& options) {
  EvalRow row;
  row.keep = keep;
  row.method = method;
  row.heal_steps = heal_steps;
  HealReport healed;
  MOERR_ASSIGN_OR_RETURN(ProxyReport built, BuildRowProxy(*base.healthy, base.healthy_path, 0, row, options, &healed,
                                                                &row.checkpoint));
  row.heal_kl_before = healed.kl_before, row.heal_kl_after = healed.kl_after;
  row.kept = built.kept;
  row.params_ratio = double(built.params_original) / built.params_proxy;
  MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer proxy, moe::LoadCheckpoint(built.checkpoint));
  StaticFidelity(warm, proxy, built.plans, base.tokens, row);
  row.accuracy = moe::Accuracy(proxy, moe::AdditionTask(), 256, 1 + options.sample_seed);
  if (options.static_only) return row;
  const Trajectory& original = base.trajectory;
  const Trajectory t = Train(proxy, options.steps, kFirstTrainerSeed);
  SetPerStepR(original, t, row);
  const Trajectory replayed = Train(proxy, options.steps, kFirstTrainerSeed, &original, &built.plans);
  row.replayed_corr_loss = Pearson(original.loss, replayed.loss);
  row.replayed_corr_kl = Pearson(original.kl, replayed.kl);
  row.replayed_corr_grad_norm = Pearson(original.grad_norm, replayed.grad_norm);
  CompareTrends(original, t, false, options.trend, row);
  CompareTrends(original, replayed, true, options.trend, row);
  row.seed_band = MeasureSeedBands(base.seeds, TrainSeeds(proxy, options.steps, options.trainer_seeds, &t),
                                   options.trend.ema_window);
  // Matched on the tokens row.logit_kl was measured on. One trainer seed has
  // no band to judge a noise row by, so none is made.
  if (options.noise_rows && options.trainer_seeds >= 2) {
    row.noise = MeasureNoiseRow(warm, base.tokens, row.logit_kl, base.seeds, options.steps, options.trend);
  }
  MOERR_RETURN_IF_ERROR(RespondToFaults(proxy, base, options, row));
  row.step_time_ratio = original.seconds / t.seconds;
  row.peak_memory_ratio = double(base.peak_bytes) / MicroBatchedPeakMemory(proxy, options.memory_micro_batch);
  row.whole_batch_peak_memory_ratio = double(original.peak_bytes) / t.peak_bytes;
  return row;
}

// `steps` steps of copies of `warm` with `fault` injected, recorded at `path`.
absl::Status RecordFault(const moe::MoeTransformer& warm, moe::FaultKind fault, int64_t seed, int64_t steps,
                         const std::string& path) {
  moe::MoeTransformer policy = moe::CopyOf(warm), reference = moe::CopyOf(warm);
  moe::GrpoOptions grpo;
  const moe::AdditionTask task;
  std::mt19937_64 calib_rng(seed + 17);
  const moe::AdditionTask::Batch calib = task.Sample(64, calib_rng);
  MOERR_ASSIGN_OR_RETURN(moe::InjectedFault injected,
                         moe::InjectFault(fault, policy, grpo, at::cat({calib.prompts, calib.answers}, 1)));
  moe::GrpoTrainer trainer(policy, reference, task, grpo, 100 + seed);
  return Annotate(RecordSteps(trainer, path, steps), path);
}

// One fault case: recorded on the original (2 steps, a dynamics fault
// `dynamics_steps`), its first failing step's failure (FaultFailure) the
// case; each configuration of `rows` built from each recorded step in turn,
// model-replayed and judged by replayer::Reproduces (the same kind and rule;
// localised: also the same phase and module class, since a proxy renumbers
// experts) until one reproduces it: the proxy's onset. A proxy that shows
// the failure at a step before the original's onset is early (CountCase).
absl::Status ReproduceFault(const moe::MoeTransformer& warm, moe::FaultKind fault, int64_t seed,
                            const EvalOptions& options, std::vector<EvalRow>& rows) {
  const std::string path = options.out_dir + "/fault.moerr";
  const int64_t recorded = moe::OnsetFromDynamics(fault) ? options.dynamics_steps : 2;
  MOERR_RETURN_IF_ERROR(RecordFault(warm, fault, seed, recorded, path));
  MOERR_ASSIGN_OR_RETURN(auto reader, formats::BundleReader::Open(path));
  const std::vector<int64_t> steps = reader->CompleteSteps();
  std::optional<replayer::Failure> original;
  int64_t onset = -1;
  for (int64_t s : steps) {
    MOERR_ASSIGN_OR_RETURN(original, FaultFailure(*reader, s, fault));
    if (original) {
      onset = s;
      break;
    }
  }
  if (!original) return absl::OkStatus();  // the fault did not show in the original: not a case
  for (EvalRow& row : rows) {
    int64_t shown_at = -1;
    replayer::Reproduction shown = replayer::Reproduction::kNo;
    for (int64_t s : steps) {
      MOERR_ASSIGN_OR_RETURN(ProxyReport built, BuildRowProxy(*reader, path, s, row, options));
      MOERR_ASSIGN_OR_RETURN(auto proxy_reader, formats::BundleReader::Open(built.bundle));
      replayer::ModelReplayOptions replay;
      replay.record_path = options.out_dir + "/proxy-replay.moerr";
      replay.overwrite = true;
      MOERR_ASSIGN_OR_RETURN(replayer::ReplayedStep replayed, replayer::ReplayModelStepTrace(*proxy_reader, s, replay));
      const formats::StepTrace& r = replayed.recording;
      MOERR_ASSIGN_OR_RETURN(shown, replayer::Reproduces(*r.reader, s, r.trace, *original));
      if (shown != replayer::Reproduction::kNo) {
        shown_at = s;
        break;
      }
    }
    CountCase(onset, shown_at, shown, row);
  }
  return absl::OkStatus();
}

}  // namespace

void CountCase(int64_t onset, int64_t shown_at, replayer::Reproduction shown, EvalRow& row) {
  MOERR_CHECK((shown == replayer::Reproduction::kNo) == (shown_at < 0));
  ++row.cases;
  if (shown == replayer::Reproduction::kNo) return;
  if (shown_at < onset) {
    ++row.early;
    return;
  }
  ++row.reproduced;
  row.localised += shown == replayer::Reproduction::kSamePlace;
  row.onset_delta += std::abs(double(shown_at - onset));
}

absl::StatusOr<EvalReport> EvaluateProxies(const EvalOptions& options, const EvalProgress& progress) {
  if (options.trainer_seeds < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("trainer seeds: %d (at least 1)", options.trainer_seeds));
  }
  MOERR_RETURN_IF_ERROR(Prepare(options));
  const EvalProgress report_progress = [&](const std::string& phase, int64_t done, int64_t total) {
    if (progress) progress(phase, done, total);
  };
  EvalReport report;
  report.options = options;
  report.preset = options.preset;
  report.family = moe::FamilyName(options.family);
  MOERR_RETURN_IF_ERROR(CatchTorch("proxy evaluation", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer warm, WarmModel(options, report_progress, report));
    report.experts = warm->config().num_experts;
    report.original_accuracy = moe::Accuracy(warm, moe::AdditionTask(), 256, 1 + options.sample_seed);
    MOERR_ASSIGN_OR_RETURN(const Baseline base, MeasureBaseline(warm, options));
    report.original_seeds = base.seeds;

    std::vector<int64_t> heals = {0};
    if (options.heal_steps > 0) heals.push_back(options.heal_steps);
    const int64_t configs = options.keeps.size() * options.methods.size() * heals.size();
    int64_t done = 0;
    for (double keep : options.keeps) {
      for (const std::string& method : options.methods) {
        for (int64_t heal : heals) {
          report_progress(options.static_only ? "static fidelity" : "static fidelity, dynamics and fault response",
                          done++, configs);
          MOERR_ASSIGN_OR_RETURN(EvalRow row, EvaluateConfiguration(warm, base, keep, method, heal, options));
          report.rows.push_back(std::move(row));
        }
      }
    }
    if (options.static_only) {
      report_progress("static fidelity", configs, configs);
      return absl::OkStatus();
    }
    const int64_t cases = options.faults.size() * options.seeds;
    int64_t case_index = 0;
    for (moe::FaultKind fault : options.faults) {
      for (int64_t seed = 0; seed < options.seeds; ++seed, ++case_index) {
        report_progress("fault reproduction", case_index, cases);
        MOERR_RETURN_IF_ERROR(ReproduceFault(warm, fault, seed, options, report.rows));
      }
    }
    for (EvalRow& row : report.rows) {
      if (row.reproduced > 0) row.onset_delta /= row.reproduced;
    }
    CompareWithRandom(report.rows);
    report_progress("fault reproduction", cases, cases);
    return absl::OkStatus();
  }));
  // An error only for a report without rows: then it has no ranking.
  if (absl::StatusOr<MethodRanking> ranking = RankMethods(report); ranking.ok()) report.ranking = std::move(*ranking);
  return report;
}

namespace {

// The trends and the fault responses of a row.
void AddDynamicsJson(const EvalRow& r, llvm::json::Object& row) {
  row["trend"] = llvm::json::Object{{"loss", ToJson(r.trend_loss)},
                                    {"reward", ToJson(r.trend_reward)},
                                    {"kl", ToJson(r.trend_kl)},
                                    {"grad_norm", ToJson(r.trend_grad_norm)}};
  row["replayed_trend"] = llvm::json::Object{{"loss", ToJson(r.replayed_trend_loss)},
                                             {"kl", ToJson(r.replayed_trend_kl)},
                                             {"grad_norm", ToJson(r.replayed_trend_grad_norm)}};
  row["seed_band"] = ToJson(r.seed_band);
  if (r.noise) row["noise"] = ToJson(*r.noise);
  llvm::json::Array responses;
  for (const FaultResponseRow& f : r.responses) {
    responses.push_back(llvm::json::Object{{"fault", moe::FaultName(f.fault)},
                                           {"seed", static_cast<int64_t>(f.seed)},
                                           {"original", ToJson(f.original)},
                                           {"proxy", ToJson(f.proxy)},
                                           {"comparison", ToJson(f.comparison)}});
  }
  row["fault_responses"] = std::move(responses);
  row["heal_steps"] = r.heal_steps;
  if (r.heal_steps > 0) {
    row["heal_kl_before"] = formats::JsonNumber(r.heal_kl_before);
    row["heal_kl_after"] = formats::JsonNumber(r.heal_kl_after);
  }
}

// The trainer seeds, and the original's run at each (the band's data).
void AddSeedsJson(const EvalReport& report, llvm::json::Object& out) {
  out["trainer_seeds"] = report.options.trainer_seeds;
  llvm::json::Array runs;
  const std::vector<uint64_t> seeds = TrainerSeeds(report.options.trainer_seeds);
  for (size_t i = 0; i < report.original_seeds.size() && i < seeds.size(); ++i) {
    llvm::json::Object run = SeriesJson(report.original_seeds[i]);
    run["seed"] = static_cast<int64_t>(seeds[i]);
    runs.push_back(std::move(run));
  }
  out["original_seeds"] = std::move(runs);
}

// The options that set the report's numbers beyond the model (the keeps,
// methods and healing are its rows' own). Static only: the sample seed and
// the warm-up alone.
llvm::json::Object OptionsJson(const EvalOptions& o) {
  llvm::json::Object out{{"warmup_steps", o.warmup_steps}, {"sample_seed", static_cast<int64_t>(o.sample_seed)}};
  if (o.static_only) return out;
  std::set<std::string> faults;  // each fault case runs alone: a set, in name order
  for (const moe::FaultKind f : o.faults) faults.insert(moe::FaultName(f));
  out["faults"] = llvm::json::Array(faults);
  out["seeds"] = o.seeds;
  out["steps"] = o.steps;
  out["ema_window"] = o.trend.ema_window;
  out["response_at"] = o.response_at;
  out["response_steps"] = o.response_steps;
  out["dynamics_steps"] = o.dynamics_steps;
  return out;
}

// A row of a static-only report: what was measured, nothing else.
llvm::json::Object StaticRowJson(const EvalRow& r) {
  const auto& num = formats::JsonNumber;
  llvm::json::Object row{{"keep", r.keep},
                         {"method", r.method},
                         {"kept", r.kept},
                         {"hidden_cosine", num(r.hidden_cosine)},
                         {"logit_kl", num(r.logit_kl)},
                         {"routing_agreement", num(r.routing_agreement)},
                         {"accuracy", num(r.accuracy)},
                         {"params_ratio", num(r.params_ratio)},
                         {"heal_steps", r.heal_steps},
                         {"checkpoint", r.checkpoint}};
  if (r.heal_steps > 0) {
    row["heal_kl_before"] = num(r.heal_kl_before);
    row["heal_kl_after"] = num(r.heal_kl_after);
  }
  return row;
}

}  // namespace

llvm::json::Object ToJson(const EvalReport& report) {
  const auto& num = formats::JsonNumber;
  llvm::json::Array rows;
  for (const EvalRow& r : report.rows) {
    if (report.options.static_only) {
      rows.push_back(StaticRowJson(r));
      continue;
    }
    llvm::json::Object row{
        {"keep", r.keep}, {"method", r.method}, {"kept", r.kept}, {"hidden_cosine", num(r.hidden_cosine)},
        {"logit_kl", num(r.logit_kl)}, {"routing_agreement", num(r.routing_agreement)}, {"accuracy", num(r.accuracy)},
        {"corr_loss", num(r.corr_loss)}, {"corr_reward", num(r.corr_reward)}, {"corr_kl", num(r.corr_kl)},
        {"corr_grad_norm", num(r.corr_grad_norm)}, {"replayed_corr_loss", num(r.replayed_corr_loss)},
        {"replayed_corr_kl", num(r.replayed_corr_kl)}, {"replayed_corr_grad_norm", num(r.replayed_corr_grad_norm)},
        {"peak_memory_ratio", num(r.peak_memory_ratio)},
        {"whole_batch_peak_memory_ratio", num(r.whole_batch_peak_memory_ratio)}, {"fault_cases", r.cases},
        {"reproduced", r.reproduced}, {"early", r.early}, {"localised", r.localised}, {"onset_delta", num(r.onset_delta)}, {"params_ratio", num(r.params_ratio)},
        {"step_time_ratio", num(r.step_time_ratio)}, {"response_onset_error", num(r.response_error.onset)},
        {"response_magnitude_error", num(r.response_error.magnitude)}, {"onset_vs_random", num(r.onset_vs_random)},
        {"magnitude_vs_random", num(r.magnitude_vs_random)}};
    AddDynamicsJson(r, row);
    row["checkpoint"] = r.checkpoint;
    rows.push_back(std::move(row));
  }
  llvm::json::Object out{{"preset", report.preset},
                            {"family", report.family},
                            {"warm_checkpoint", report.warm_checkpoint},
                            {"static_only", report.options.static_only},
                            {"options", OptionsJson(report.options)},
                            {"experts", report.experts},
                            {"original_accuracy", report.original_accuracy},
                            {"expert_diversity", llvm::json::Object{{"initial", ToJson(report.initial)},
                                                                    {"warm", ToJson(report.warm)}}},
                            {"rows", std::move(rows)}};
  if (!report.options.static_only) AddSeedsJson(report, out);
  if (report.ranking) out["ranking"] = ToJson(*report.ranking);
  return out;
}

}  // namespace moerr::proxy
