#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "moe/training_run.h"
#include "recorder/recorder.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"
#include "tools/recording_observer.h"

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

}  // namespace

void AddTrainCommand(CLI::App& app, int& exit_code) {
  struct Options {
    moe::TrainOptions train;
    std::string family = "qwen3_moe", fault = "none", precision = "fp32";
    std::string record, trigger = "always", bundle, fp16_overflow = "inf";
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train the reference MoE model: supervised warm-up, then GRPO steps, optionally with a fault");
  cmd->add_option("--preset", opts->train.preset, "Model size: tiny, small, wide")->capture_default_str();
  cmd->add_option("--family", opts->family, "Checkpoint family: qwen2_moe, qwen3_moe, deepseek_v3, mixtral")
      ->capture_default_str();
  cmd->add_option("--fault", opts->fault,
                  "Fault to inject: none, expert-overflow, grad-overflow, logprob-precision, bad-kernel, "
                  "router-collapse, skip-update")
      ->capture_default_str();
  cmd->add_option("--steps", opts->train.steps, "GRPO steps")->capture_default_str();
  cmd->add_option("--warmup-steps", opts->train.warmup_steps, "Supervised warm-up steps")->capture_default_str();
  cmd->add_option("--init", opts->train.init_checkpoint, "Start from this HF checkpoint directory (skips warm-up)");
  cmd->add_option("--precision", opts->precision, "fp32, bf16 or fp16-emu")->capture_default_str();
  cmd->add_option("--fp16-overflow", opts->fp16_overflow,
                  "fp16 emulation: an overflow gives inf, or saturates to +-65504 (as NPUs can)")
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
                  "When to write steps: always, window:A-B, or anomaly[:STEPS[:SPIKE]] (keep STEPS steps in memory; "
                  "write them when the loss or grad norm is non-finite or the grad norm exceeds SPIKE x its median)")
      ->capture_default_str();
  cmd->add_option("--bundle", opts->bundle, "Bundle path for --record (default: OUTPUT/run.moerr)");
  cmd->callback([opts, &exit_code] {
    Options& o = *opts;
    auto family = moe::ParseFamily(o.family);
    auto fault = moe::ParseFault(o.fault);
    auto precision = moe::ParsePrecision(o.precision);
    for (const absl::Status& s : {family.status(), fault.status(), precision.status()}) {
      if (!s.ok()) {
        exit_code = ReportError(s);
        return;
      }
    }
    o.train.family = *family;
    o.train.fault = *fault;
    o.train.precision = *precision;
    o.train.fp16_saturate = o.fp16_overflow == "saturate";
    std::unique_ptr<RecordingObserver> observer;
    if (!o.record.empty()) {
      auto mode = recorder::ParseCaptureMode(o.record);
      if (!mode.ok()) {
        exit_code = ReportError(mode.status());
        return;
      }
      recorder::RecordOptions record(o.bundle.empty() ? o.train.out_dir + "/run.moerr" : o.bundle);
      record.set_mode(*mode).set_overwrite(o.train.overwrite);
      if (absl::Status s = ParseTrigger(o.trigger, record); !s.ok()) {
        exit_code = ReportError(s);
        return;
      }
      observer = std::make_unique<RecordingObserver>(std::move(record));
    }
    PhasedProgress progress;
    auto report = moe::RunTraining(
        o.train, [&](const std::string& p, int64_t done, int64_t total) { progress.Update(p, done, total); },
        observer.get());
    progress.Finish();
    if (!report.ok()) {
      exit_code = ReportError(report.status());
      return;
    }
    if (o.train.init_checkpoint.empty()) {
      std::printf("warm-up: %lld steps, loss %.3f, accuracy %.1f%% on 256 held-out sums\n",
                  static_cast<long long>(o.train.warmup_steps), report->warmup.final_loss, 100 * report->warmup.accuracy);
    }
    if (report->fault.kind != moe::FaultKind::kNone) std::printf("fault: %s\n", report->fault.description.c_str());
    std::printf("%6s %9s %7s %9s %10s %10s %8s %s\n", "step", "loss", "reward", "kl", "grad_norm", "loss_scale",
                "load_H", "");
    for (const moe::StepMetrics& m : report->steps) {
      std::printf("%6lld %9.4f %7.3f %9.5f %10.4g %10.4g %8.3f %s\n", static_cast<long long>(m.step), m.loss, m.reward,
                  m.kl, m.grad_norm, m.loss_scale, m.load_entropy,
                  m.skipped ? "skipped (non-finite)" : (m.finite ? "" : "non-finite"));
    }
    std::printf("accuracy after RL: %.1f%%\nmetrics: %s\ncheckpoint: %s\n", 100 * report->final_accuracy,
                report->metrics_path.c_str(), report->checkpoint_dir.c_str());
    if (observer && observer->started()) {
      const recorder::Recorder& rec = observer->recorder();
      std::string steps;
      for (int64_t s : rec.written_steps()) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
      std::printf("bundle: %s (%s mode; %llu ops traced; steps written: %s)\n", rec.path().c_str(), o.record.c_str(),
                  static_cast<unsigned long long>(rec.ops_recorded()), steps.empty() ? "none" : steps.c_str());
    }
    exit_code = kExitOk;
  });
}

}  // namespace moerr::tools
