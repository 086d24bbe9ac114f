#include "tests/testing/recording.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "absl/strings/match.h"

#include "moe/grpo_trainer.h"
#include "moe/warmup.h"
#include "recorder/recorder.h"
#include "replayer/model_replay.h"
#include "replayer/step_failure.h"

namespace moerr::testing {
namespace {

std::unique_ptr<formats::BundleReader> Record(const std::string& path, moe::MoeTransformer& policy,
                                              moe::MoeTransformer& reference, const moe::GrpoOptions& options,
                                              recorder::CaptureMode mode, int steps, uint64_t seed, bool& finite) {
  auto rec = recorder::Recorder::Start(recorder::RecordOptions(path).set_mode(mode).set_crash_handler(false)).value();
  policy->SetRoutingObserver(rec.get());
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), options, seed);
  EXPECT_TRUE(replayer::RecordTrainerStart(*rec, trainer).ok());
  finite = true;
  for (int s = 0; s < steps; ++s) {
    const absl::StatusOr<moe::StepMetrics> m = replayer::RecordStep(*rec, trainer, s);
    EXPECT_TRUE(m.ok()) << m.status();
    finite = finite && m.ok() && m->finite;
  }
  EXPECT_TRUE(rec->Stop().ok());
  policy->SetRoutingObserver(nullptr);
  return formats::BundleReader::Open(path).value();
}

}  // namespace

std::unique_ptr<formats::BundleReader> RecordTinySteps(const std::string& path, moe::Precision precision,
                                                       recorder::CaptureMode mode, int steps, int64_t micro_batch) {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  moe::MoeTransformer policy(config), reference(config);
  moe::GrpoOptions options;
  options.numerics.precision = precision;
  options.rollout_numerics.precision = precision;
  options.micro_batch = micro_batch;
  bool finite = false;
  return Record(path, policy, reference, options, mode, steps, /*seed=*/1, finite);
}

std::unique_ptr<formats::BundleReader> RecordFaultyStep(const std::string& path, moe::FaultKind kind,
                                                        recorder::CaptureMode mode, moe::InjectedFault& fault,
                                                        bool& finite, int64_t warmup_steps, int steps) {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  moe::MoeTransformer policy(config);
  if (warmup_steps > 0) {
    moe::WarmupOptions warmup;
    warmup.steps = warmup_steps;
    warmup.batch = 32;
    moe::Warmup(policy, moe::AdditionTask(), warmup);
  }
  moe::MoeTransformer reference = moe::CopyOf(policy);
  moe::GrpoOptions options;
  std::mt19937_64 rng(9);
  const moe::AdditionTask::Batch calib = moe::AdditionTask().Sample(32, rng);
  fault = moe::InjectFault(kind, policy, options, at::cat({calib.prompts, calib.answers}, 1)).value();
  return Record(path, policy, reference, options, mode, steps, /*seed=*/7, finite);
}

std::unique_ptr<formats::BundleReader> RecordScaledExpertStep(const std::string& path, moe::Precision precision,
                                                              double extra, moe::InjectedFault& fault, bool& finite) {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  moe::MoeTransformer policy(config);
  moe::MoeTransformer reference = moe::CopyOf(policy);
  moe::GrpoOptions options;
  std::mt19937_64 rng(9);
  const moe::AdditionTask::Batch calib = moe::AdditionTask().Sample(32, rng);
  fault = moe::InjectFault(moe::FaultKind::kExpertOverflow, policy, options, at::cat({calib.prompts, calib.answers}, 1))
              .value();
  int scaled = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : policy->named_parameters()) {
      if (absl::StartsWith(p.key(), fault.module + ".") && absl::StrContains(p.key(), "down_proj")) {
        p.value().mul_(extra);
        ++scaled;
      }
    }
  }
  EXPECT_EQ(scaled, 1) << fault.module;
  options.numerics.precision = precision;
  options.rollout_numerics = options.numerics;
  return Record(path, policy, reference, options, recorder::CaptureMode::kStats, 1, /*seed=*/7, finite);
}

ModelReplayed ModelReplayToTrace(const formats::BundleReader& bundle, int64_t step, const std::string& path,
                                 moe::StepMetrics* metrics) {
  replayer::ModelReplayOptions options;
  options.record_path = path;
  options.overwrite = true;
  auto replayed = replayer::ReplayModelStepTrace(bundle, step, options);
  EXPECT_TRUE(replayed.ok()) << replayed.status();
  if (!replayed.ok()) return {};
  if (metrics != nullptr) *metrics = replayed->report.metrics;
  return {std::move(replayed->recording.reader), std::move(replayed->recording.trace)};
}

}  // namespace moerr::testing
