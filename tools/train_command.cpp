#include <cstdio>

#include "moe/training_run.h"
#include "support/progress.h"
#include "tools/command.h"

namespace moerr::tools {

void AddTrainCommand(CLI::App& app, int& exit_code) {
  struct Options {
    moe::TrainOptions train;
    std::string family = "qwen3_moe", fault = "none", precision = "fp32";
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
  cmd->add_option("--seed", opts->train.seed, "Random seed")->capture_default_str();
  cmd->add_option("-o,--output", opts->train.out_dir, "Output directory: metrics.jsonl, warmup/, checkpoint/")
      ->required();
  cmd->add_flag("--force", opts->train.overwrite, "Overwrite an earlier run's files in the output directory");
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
    std::unique_ptr<Progress> bar;
    std::string phase;
    auto report = moe::RunTraining(o.train, [&](const std::string& p, int64_t done, int64_t total) {
      if (p != phase) {
        bar = std::make_unique<Progress>(p, total);
        phase = p;
      }
      bar->Update(done);
    });
    bar.reset();
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
    exit_code = kExitOk;
  });
}

}  // namespace moerr::tools
