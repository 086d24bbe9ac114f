#include "tools/recording_observer.h"

#include "replayer/model_replay.h"
#include "support/status.h"

namespace moerr::tools {

absl::Status RecordingObserver::OnStart(moe::GrpoTrainer& trainer) {
  auto rec = recorder::Recorder::Start(options_);
  if (!rec.ok()) return rec.status();
  rec_ = std::move(*rec);
  trainer_ = &trainer;
  std::vector<std::pair<std::string, at::Tensor>> named = trainer.policy()->NamedTensors();
  for (auto& [name, t] : trainer.reference()->NamedTensors()) named.emplace_back("reference." + name, t);
  rec_->NameTensors(named);
  trainer.policy()->SetRoutingObserver(rec_.get());
  return replayer::RecordTrainerStart(*rec_, trainer);
}

absl::Status RecordingObserver::BeforeStep(int64_t step) {
  MOERR_RETURN_IF_ERROR(rec_->StepBegin(step));
  return replayer::RecordTrainerStep(*rec_, *trainer_);
}

absl::Status RecordingObserver::AfterStep(const moe::StepMetrics& m, double loss_scale) {
  MOERR_RETURN_IF_ERROR(rec_->AnnotateStep("metrics", moe::MetricsToJson(m)));
  MOERR_RETURN_IF_ERROR(rec_->AnnotateStep("loss_scale", loss_scale));
  return rec_->StepEnd(m.step, {m.loss, m.grad_norm});
}

absl::Status RecordingObserver::OnFinish() {
  trainer_->policy()->SetRoutingObserver(nullptr);
  return rec_->Stop();
}

}  // namespace moerr::tools
