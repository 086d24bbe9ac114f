#include "tools/recording_observer.h"

#include "support/status.h"

namespace moerr::tools {

absl::Status RecordingObserver::OnStart(moe::MoeTransformer& policy, moe::MoeTransformer& reference,
                                        const moe::GrpoOptions& grpo) {
  auto rec = recorder::Recorder::Start(options_);
  if (!rec.ok()) return rec.status();
  rec_ = std::move(*rec);
  std::vector<std::pair<std::string, at::Tensor>> named = policy->NamedTensors();
  for (auto& [name, t] : reference->NamedTensors()) named.emplace_back("reference." + name, t);
  rec_->NameTensors(named);
  policy->SetRoutingObserver(rec_.get());
  policy_ = policy;
  MOERR_RETURN_IF_ERROR(rec_->Annotate("model_config", moe::ToHfConfig(policy->config())));
  return rec_->Annotate("optimizer",
                        llvm::json::Object{{"name", "AdamW"},
                                           {"lr", grpo.lr},
                                           {"weight_decay", grpo.weight_decay},
                                           {"max_grad_norm", grpo.max_grad_norm},
                                           {"clip_eps", grpo.clip_eps},
                                           {"kl_coef", grpo.kl_coef},
                                           {"precision", moe::PrecisionName(grpo.numerics.precision)}});
}

absl::Status RecordingObserver::AfterStep(const moe::StepMetrics& m, double loss_scale) {
  MOERR_RETURN_IF_ERROR(rec_->AnnotateStep("metrics", moe::MetricsToJson(m)));
  MOERR_RETURN_IF_ERROR(rec_->AnnotateStep("loss_scale", loss_scale));
  return rec_->StepEnd(m.step, {m.loss, m.grad_norm});
}

absl::Status RecordingObserver::OnFinish() {
  policy_->SetRoutingObserver(nullptr);
  return rec_->Stop();
}

}  // namespace moerr::tools
