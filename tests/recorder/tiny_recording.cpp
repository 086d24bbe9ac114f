#include "tests/recorder/tiny_recording.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"

namespace moerr::recorder::testing {

Models TinyModels() {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  return {moe::MoeTransformer(config), moe::MoeTransformer(config)};
}

std::unique_ptr<formats::BundleReader> RecordSteps(const std::string& path, CaptureMode mode, int steps,
                                                   Models* models) {
  Models local = TinyModels();
  Models& m = models ? *models : local;
  auto rec = Recorder::Start(RecordOptions(path).set_mode(mode).set_crash_handler(false)).value();
  std::vector<std::pair<std::string, at::Tensor>> named = m.policy->NamedTensors();
  for (auto& [name, t] : m.reference->NamedTensors()) named.emplace_back("reference." + name, t);
  rec->NameTensors(named);
  m.policy->SetRoutingObserver(rec.get());
  moe::GrpoTrainer trainer(m.policy, m.reference, moe::AdditionTask(), moe::GrpoOptions(), 1);
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE(rec->StepBegin(s).ok());
    const moe::StepMetrics metrics = trainer.Step();
    EXPECT_TRUE(rec->StepEnd(s, {metrics.loss, metrics.grad_norm}).ok());
  }
  EXPECT_TRUE(rec->Stop().ok());
  m.policy->SetRoutingObserver(nullptr);
  return formats::BundleReader::Open(path).value();
}

}  // namespace moerr::recorder::testing
