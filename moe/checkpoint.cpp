#include "moe/checkpoint.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/hf_checkpoint.h"
#include "moe/expert_layout.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::moe {

absl::Status SaveCheckpoint(MoeTransformer& model, const std::string& dir, bool overwrite) {
  std::vector<std::pair<std::string, formats::TensorView>> views;
  for (const auto& [name, tensor] : model->NamedTensors()) {
    MOERR_ASSIGN_OR_RETURN(formats::TensorView v, recorder::ViewOf(tensor.detach()));
    views.emplace_back(name, std::move(v));
  }
  return formats::SaveHfCheckpoint(dir, ToHfConfig(model->config()), views, overwrite);
}

absl::Status LoadWeights(MoeTransformer& model, const std::map<std::string, formats::TensorView>& tensors) {
  std::vector<std::string> problems;
  std::map<std::string, at::Tensor> wanted;
  for (const auto& [name, t] : model->NamedTensors()) wanted.emplace(name, t);
  for (const auto& [name, view] : tensors) {
    auto it = wanted.find(name);
    if (it == wanted.end()) {
      problems.push_back(absl::StrFormat("unexpected tensor \"%s\" (the model has no such parameter)", name));
      continue;
    }
    const at::Tensor& target = it->second;
    if (view.shape != target.sizes().vec()) {
      problems.push_back(absl::StrFormat("\"%s\": shape [%s], the model needs [%s]", name, absl::StrJoin(view.shape, ", "),
                                         absl::StrJoin(target.sizes().vec(), ", ")));
    }
    const bool float_view = view.dtype == formats::DType::kF32 || view.dtype == formats::DType::kBF16 ||
                            view.dtype == formats::DType::kF16 || view.dtype == formats::DType::kF64;
    if (!float_view) {
      problems.push_back(absl::StrFormat("\"%s\": dtype %s, the model needs a floating-point tensor", name,
                                         formats::DTypeName(view.dtype)));
    }
  }
  for (const auto& [name, t] : wanted) {
    if (!tensors.count(name)) problems.push_back(absl::StrFormat("missing tensor \"%s\"", name));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("checkpoint does not fit the model (%d problems): %s",
                                                      problems.size(), absl::StrJoin(problems, "; ")));
  }
  return CatchTorch("loading weights", [&] {
    torch::NoGradGuard no_grad;
    for (const auto& [name, view] : tensors) wanted.at(name).copy_(recorder::ToTensor(view));
    return absl::OkStatus();
  });
}

namespace {

// A DeepSeek-V3 checkpoint of MLA weights whose config.json lacks kv_lora_rank
// reads as GQA, and every attention tensor would be reported missing or
// unexpected: name the missing key instead.
absl::Status CheckLatentKeys(const MoeConfig& config, const std::map<std::string, formats::TensorView>& tensors) {
  if (config.family != Family::kDeepseekV3 || config.IsMla()) return absl::OkStatus();
  for (const auto& [name, view] : tensors) {
    if (name.find(".self_attn.kv_a_proj_with_mqa.") == std::string::npos) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "the checkpoint holds multi-head latent attention tensors (\"%s\") but config.json lacks kv_lora_rank "
        "(absent, null or 0 is plain attention): add the model's kv_lora_rank and its other MLA keys",
        name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MoeTransformer> LoadCheckpoint(const std::string& dir) {
  MOERR_ASSIGN_OR_RETURN(formats::HfCheckpoint ckpt, formats::LoadHfCheckpoint(dir));
  auto config = FromHfConfig(ckpt.config);
  if (!config.ok()) return Annotate(config.status(), dir);
  MOERR_RETURN_IF_ERROR(Annotate(CheckLatentKeys(*config, ckpt.tensors), dir));
  // The views borrow ckpt.shards' mapped bytes, which live until the weights are copied.
  auto tensors = SplitFusedExperts(*config, std::move(ckpt.tensors));
  if (!tensors.ok()) return Annotate(tensors.status(), dir);
  MoeTransformer model(*config);
  if (absl::Status s = LoadWeights(model, *tensors); !s.ok()) return Annotate(s, dir);
  return model;
}

}  // namespace moerr::moe
