// Writes what the PyTorch comparison (bench/replayer/detect_anomaly.py) needs
// of a recorded step: the policy's weights at the step's start and the step's
// batch, as an HF-layout checkpoint. The batch tensors are "batch.<name>";
// config.json also carries "moerr_grpo" (the GRPO options) and
// "moerr_loss_scale".
//
//   export_step BUNDLE STEP OUT_DIR
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "formats/bundle_reader.h"
#include "formats/hf_checkpoint.h"
#include "moe/moe_config.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/model_replay.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr {
namespace {

absl::Status Export(const std::string& bundle, int64_t step, const std::string& out) {
  MOERR_ASSIGN_OR_RETURN(auto reader, formats::BundleReader::Open(bundle));
  MOERR_ASSIGN_OR_RETURN(auto trainer, replayer::LoadTrainer(*reader, step));
  return CatchTorch("export", [&]() -> absl::Status {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& [name, t] : trainer->policy()->NamedTensors()) tensors.emplace_back(name, t.detach().clone());
    llvm::json::Object config = moe::ToHfConfig(trainer->policy()->config());
    config["moerr_grpo"] = moe::ToJson(trainer->options());
    config["moerr_loss_scale"] = trainer->loss_scale();
    trainer->Step();
    const moe::StepBatch& b = trainer->last_batch();
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"prompts", b.prompts},
                                  {"responses", b.responses},
                                  {"mask", b.mask},
                                  {"advantages", b.advantages},
                                  {"old_logp", b.old_logp},
                                  {"ref_logp", b.ref_logp}}) {
      tensors.emplace_back(std::string("batch.") + name, t.contiguous());
    }
    std::vector<std::pair<std::string, formats::TensorView>> views;
    for (const auto& [name, t] : tensors) {
      MOERR_ASSIGN_OR_RETURN(formats::TensorView v, recorder::ViewOf(t));
      views.emplace_back(name, std::move(v));
    }
    return formats::SaveHfCheckpoint(out, config, views, /*overwrite=*/true);
  });
}

}  // namespace
}  // namespace moerr

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s BUNDLE STEP OUT_DIR\n", argv[0]);
    return 2;
  }
  const absl::Status s = moerr::Export(argv[1], std::atoll(argv[2]), argv[3]);
  if (!s.ok()) {
    std::fprintf(stderr, "export_step: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
