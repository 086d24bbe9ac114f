#include <cstdio>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "moe/faults/fault_table.h"
#include "moe/moe_config.h"
#include "moe/training_run.h"
#include "recorder/recorder.h"
#include "replayer/world_failure.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/recording_observer.h"
#include "world/train_ranks.h"

namespace moerr::tools {
namespace {

// "always", "window:A-B" or "anomaly[:N[:X]]" (N steps kept, X the spike factor).
absl::Status ParseTrigger(const std::string& text, recorder::RecordOptions& options) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  auto bad = [&] {
    return absl::InvalidArgumentError("--trigger must be always, window:A-B or anomaly[:STEPS[:SPIKE]], not \"" +
                                      text + "\"");
  };
  if (parts[0] == "always" && parts.size() == 1) return absl::OkStatus();
  if (parts[0] == "window" && parts.size() == 2) {
    const std::vector<std::string> range = absl::StrSplit(parts[1], '-');
    int64_t a, b;
    if (range.size() != 2 || !absl::SimpleAtoi(range[0], &a) || !absl::SimpleAtoi(range[1], &b) || a > b) return bad();
    options.set_window(a, b);
    return absl::OkStatus();
  }
  if (parts[0] == "anomaly" && parts.size() <= 3) {
    int64_t ring = 2;
    double spike = 10;
    if (parts.size() > 1 && (!absl::SimpleAtoi(parts[1], &ring) || ring < 1)) return bad();
    if (parts.size() > 2 && (!absl::SimpleAtod(parts[2], &spike) || spike <= 1)) return bad();
    options.set_anomaly(ring, spike);
    return absl::OkStatus();
  }
  return bad();
}

struct TrainArgs {
  moe::TrainOptions train;
  std::string family = "qwen3_moe", fault = "none", precision = "fp32";
  std::string record, trigger = "always", bundle, fp16_overflow = "inf";
  world::RanksOptions ranks;
};

// --record MODE: the observer that records the RL steps into the bundle; a
// rank records into RUN/rank<K>.moerr of the run directory (--bundle, by
// default OUTPUT/run), and rank 0 writes the manifest there.
absl::StatusOr<std::unique_ptr<world::RecordingObserver>> MakeRecorder(const TrainArgs& o, const world::RankSession& rank) {
  MOERR_ASSIGN_OR_RETURN(const recorder::CaptureMode mode, recorder::ParseCaptureMode(o.record));
  const std::string run_dir = o.bundle.empty() ? o.train.out_dir + "/run" : o.bundle;
  recorder::RecordOptions record(!rank.parallel   ? (o.bundle.empty() ? o.train.out_dir + "/run.moerr" : o.bundle)
                                 : run_dir + "/rank" + std::to_string(rank.env.rank) + ".moerr");
  record.set_mode(mode).set_overwrite(o.train.overwrite);
  MOERR_RETURN_IF_ERROR(ParseTrigger(o.trigger, record));
  auto observer = std::make_unique<world::RecordingObserver>(std::move(record));
  if (rank.parallel) observer->set_rank(rank.parallel.get(), run_dir);
  if (o.train.fault != moe::FaultKind::kNone) {
    observer->set_fault(replayer::FaultAnnotation(o.train.fault, o.train.fault_rank));
  }
  return observer;
}

void PrintRun(const TrainArgs& o, const world::RankSession& rank, const moe::TrainReport& report,
              const world::RecordingObserver* observer) {
  if (rank.parallel) {
    std::printf("%lld ranks, expert parallelism %lld: metrics and checkpoint from rank 0\n",
                static_cast<long long>(rank.env.world_size), static_cast<long long>(o.ranks.ep));
  }
  if (o.train.init_checkpoint.empty()) {
    std::printf("warm-up: %lld steps, loss %.3f, accuracy %.1f%% on 256 held-out sums\n",
                static_cast<long long>(o.train.warmup_steps), report.warmup.final_loss, 100 * report.warmup.accuracy);
  }
  if (report.fault.kind != moe::FaultKind::kNone) std::printf("fault: %s\n", report.fault.description.c_str());
  std::printf("%6s %9s %7s %9s %10s %10s %8s %s\n", "step", "loss", "reward", "kl", "grad_norm", "loss_scale",
              "load_H", "");
  for (const moe::StepMetrics& m : report.steps) {
    std::printf("%6lld %9.4f %7.3f %9.5f %10.4g %10.4g %8.3f %s\n", static_cast<long long>(m.step), m.loss, m.reward,
                m.kl, m.grad_norm, m.loss_scale, m.load_entropy,
                m.skipped ? "skipped (non-finite)" : (m.finite ? "" : "non-finite"));
  }
  std::printf("accuracy after RL: %.1f%%\nmetrics: %s\ncheckpoint: %s\n", 100 * report.final_accuracy,
              report.metrics_path.c_str(), report.checkpoint_dir.c_str());
  if (observer != nullptr && observer->started()) {
    const recorder::Recorder& rec = observer->recorder();
    std::string steps;
    for (int64_t s : rec.written_steps()) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    std::printf("bundle: %s (%s mode; %llu ops traced; steps written: %s)\n", rec.path().c_str(), o.record.c_str(),
                static_cast<unsigned long long>(rec.ops_recorded()), steps.empty() ? "none" : steps.c_str());
  }
}

ExitOr RunTrain(TrainArgs& o) {
  MOERR_ASSIGN_OR_RETURN(o.train.family, moe::ParseFamily(o.family));
  MOERR_ASSIGN_OR_RETURN(o.train.fault, moe::ParseFault(o.fault));
  MOERR_ASSIGN_OR_RETURN(o.train.precision, moe::ParsePrecision(o.precision));
  o.train.fp16_saturate = o.fp16_overflow == "saturate";
  MOERR_ASSIGN_OR_RETURN(const auto rank_env, distributed::RankFromEnvironment());
  if (o.train.fault_rank >= 0) {
    const int64_t world = rank_env.has_value() ? rank_env->world_size : o.ranks.ranks;
    if (o.train.fault == moe::FaultKind::kNone || !moe::FaultRowOf(o.train.fault).in_weights) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--fault-rank needs a fault in one rank's weights: %s (the others change only what every rank shares: "
          "numerics, options)",
          moe::FaultsInWeights()));
    }
    if (world <= 1) return absl::InvalidArgumentError("--fault-rank applies to several ranks: pass --ranks N (N > 1)");
    if (o.train.fault_rank >= world) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--fault-rank %d: the ranks are 0 to %d", o.train.fault_rank, world - 1));
    }
  }
  if (!rank_env.has_value() && o.ranks.ranks > 1) return world::LaunchRanks(o.ranks);
  if (!rank_env.has_value()) MOERR_RETURN_IF_ERROR(world::CheckOneProcess(o.ranks));
  world::RankSession rank;
  if (rank_env.has_value()) {
    MOERR_ASSIGN_OR_RETURN(rank, world::JoinAsRank(*rank_env, o.ranks));
    o.train.parallel = rank.parallel.get();
  }
  const bool quiet = rank.parallel && rank.env.rank != 0;  // rank 0 speaks for the world
  std::unique_ptr<world::RecordingObserver> observer;
  if (!o.record.empty()) {
    MOERR_ASSIGN_OR_RETURN(observer, MakeRecorder(o, rank));
  }
  // The recorder first: a rank fault that kills or stalls registers for the
  // collectives after it (world::RankSession).
  moe::TrainObservers observers;
  observers.Add(observer.get());
  observers.Add(rank.fault.get());
  PhasedProgress progress;
  auto report = moe::RunTraining(
      o.train,
      [&](const std::string& p, int64_t done, int64_t total) {
        if (!quiet) progress.Update(p, done, total);
      },
      &observers);
  if (!quiet) progress.Finish();
  if (!report.ok()) {
    const absl::Status& s = report.status();
    const std::string who = "rank " + std::to_string(rank.env.rank) + ": ";
    return rank.parallel && s.message().find(who) == absl::string_view::npos
               ? absl::Status(s.code(), who + std::string(s.message()))
               : s;
  }
  if (!quiet) PrintRun(o, rank, *report, observer.get());
  return kExitOk;
}

}  // namespace

void AddTrainCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train the reference MoE model: supervised warm-up, then GRPO steps, optionally with a fault");
  cmd->add_option("--preset", opts->train.preset,
                  "Model size, one of:\n" + std::string(absl::StripTrailingAsciiWhitespace(moe::PresetHelp())))
      ->capture_default_str()
      ->check(CLI::IsMember(moe::PresetNames()));
  cmd->add_option("--family", opts->family, "Checkpoint family: qwen2_moe, qwen3_moe, deepseek_v3, mixtral")
      ->capture_default_str();
  cmd->add_option("--fault", opts->fault, moe::FaultHelp(moe::FaultScope::kProcess))->capture_default_str();
  cmd->add_option("--steps", opts->train.steps, "GRPO steps")->capture_default_str();
  cmd->add_option("--warmup-steps", opts->train.warmup_steps, "Supervised warm-up steps")->capture_default_str();
  cmd->add_option("--init", opts->train.init_checkpoint, "Start from this HF checkpoint directory (skips warm-up)");
  cmd->add_option("--precision", opts->precision,
                  "fp32; bf16 or fp16 (native, CPU autocast); fp16-emu (fp32 compute rounded to fp16 at every "
                  "module boundary, the fp16 faults' precision)")
      ->capture_default_str();
  cmd->add_option("--fp16-overflow", opts->fp16_overflow,
                  "fp16-emu: an overflow gives inf, or saturates to +-65504 (as NPUs can)")
      ->check(CLI::IsMember({"inf", "saturate"}))
      ->capture_default_str();
  cmd->add_option("--micro-batch", opts->train.micro_batch,
                  "Sequences per training forward and backward, gradients accumulated (0: the whole batch at once)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--seed", opts->train.seed, "Random seed")->capture_default_str();
  cmd->add_option("-o,--output", opts->train.out_dir, "Output directory: metrics.jsonl, warmup/, checkpoint/")
      ->required();
  cmd->add_flag("--force", opts->train.overwrite, "Overwrite an earlier run's files in the output directory");
  cmd->add_option("--record", opts->record, "Record the RL steps into a bundle: stats, replayable or full");
  cmd->add_option("--trigger", opts->trigger,
                  "When to write steps: always, window:A-B, or anomaly[:STEPS[:SPIKE]] (keep the last STEPS steps in "
                  "files beside the bundle, BUNDLE.ring, which a killed run leaves for `moerr salvage`; write them into "
                  "the bundle at a step's first non-finite value from finite inputs, or when its loss or grad norm is "
                  "non-finite or the grad norm exceeds SPIKE x its median)")
      ->capture_default_str();
  cmd->add_option("--bundle", opts->bundle, "Bundle path for --record (default: OUTPUT/run.moerr); with several ranks, the run directory of their bundles and world.json (default: OUTPUT/run)");
  cmd->add_option("--ranks", opts->ranks.ranks,
                  "Rank processes to launch (expert and data parallel, c10d Gloo); a rank started by another launcher "
                  "takes RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--ep", opts->ranks.ep, "Ranks per expert-parallel group (divides --ranks and the experts)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--collective-timeout", opts->ranks.collective_timeout_s,
                  "Seconds a collective (and the rendezvous) may take before the rank fails naming it")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--deadline", opts->ranks.deadline_s,
                  "Seconds the launcher lets the whole run take before it kills the ranks still running (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--store", opts->ranks.store, "Rendezvous store: file (a c10d FileStore) or tcp (TCPStore, 127.0.0.1)")
      ->capture_default_str()
      ->check(CLI::IsMember({"file", "tcp"}));
  cmd->add_option("--fault-rank", opts->train.fault_rank,
                  "With --ranks and a --fault in one rank's weights (" + moe::FaultsInWeights() +
                      "): only rank K's weights get the fault (expert-overflow breaks an expert rank K hosts; "
                      "bad-kernel raises rank K's logits); the numerics and options the fault needs change on every "
                      "rank (bad-kernel's naive softmax)");
  cmd->add_option("--rank-fault", opts->ranks.rank_fault, moe::FaultHelp(moe::FaultScope::kRanks));
  OnRun(cmd, exit_code, [opts] { return RunTrain(*opts); });
}

}  // namespace moerr::tools
