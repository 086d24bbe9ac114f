#include "world/recording_observer.h"

#include <unistd.h>

#include "formats/annotations.h"
#include "formats/world_manifest.h"
#include "replayer/model_replay.h"
#include "support/filesystem.h"
#include "support/status.h"

namespace moerr::world {

absl::Status RecordingObserver::OnStart(moe::GrpoTrainer& trainer) {
  if (parallel_ != nullptr) {
    MOERR_RETURN_IF_ERROR(MakeDirectory(run_dir_));
    // An earlier run's finished bundle would stand for this rank if it died
    // before finishing its own (formats::RankBundlePath prefers it).
    if (options_.overwrite) ::unlink(options_.path.c_str());
  }
  auto rec = recorder::Recorder::Start(options_);
  if (!rec.ok()) return rec.status();
  rec_ = std::move(*rec);
  trainer_ = &trainer;
  std::vector<std::pair<std::string, at::Tensor>> named = trainer.policy()->NamedTensors();
  for (auto& [name, t] : trainer.reference()->NamedTensors()) named.emplace_back("reference." + name, t);
  rec_->NameTensors(named);
  trainer.policy()->SetRoutingObserver(rec_.get());
  if (parallel_ != nullptr) {
    parallel_->AddObserver(rec_.get());
    const moe::ParallelLayout& layout = parallel_->layout();
    if (layout.rank == 0) {
      MOERR_RETURN_IF_ERROR(formats::WriteWorldManifest(
          run_dir_, formats::ExpertParallelWorld(layout.world_size, layout.ep_size,
                                                 trainer.policy()->config().num_experts)));
    }
  }
  if (!fault_.empty()) MOERR_RETURN_IF_ERROR(rec_->Annotate(formats::kFaultAnnotation, llvm::json::Object(fault_)));
  return replayer::RecordTrainerStart(*rec_, trainer);
}

RecordingObserver::~RecordingObserver() {
  if (parallel_ != nullptr && rec_ != nullptr) parallel_->RemoveObserver(rec_.get());
}

absl::Status RecordingObserver::BeforeStep(int64_t step) {
  MOERR_RETURN_IF_ERROR(rec_->StepBegin(step));
  return replayer::RecordTrainerStep(*rec_, *trainer_);
}

absl::Status RecordingObserver::AfterStep(const moe::StepMetrics& m, double loss_scale) {
  MOERR_RETURN_IF_ERROR(replayer::RecordTrainerBatch(*rec_, *trainer_));
  MOERR_RETURN_IF_ERROR(rec_->AnnotateStep(formats::kMetricsAnnotation, moe::MetricsToJson(m)));
  MOERR_RETURN_IF_ERROR(rec_->AnnotateStep(formats::kLossScaleAnnotation, loss_scale));
  return rec_->StepEnd(m.step, {m.loss, m.grad_norm});
}

absl::Status RecordingObserver::OnFinish() {
  trainer_->policy()->SetRoutingObserver(nullptr);
  if (parallel_ != nullptr) parallel_->RemoveObserver(rec_.get());
  parallel_ = nullptr;
  return rec_->Stop();
}

}  // namespace moerr::world
