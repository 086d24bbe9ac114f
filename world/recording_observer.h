// A TrainObserver that records a run's RL steps with the Recorder: `moerr
// train --record` and `moerr demo` use it.
#pragma once

#include <memory>

#include "moe/training_run.h"
#include "recorder/recorder.h"

namespace moerr::world {

// Records the RL steps of a run: the model, options, trainer state (for model
// replay) and step outcomes go into the bundle next to the trace.
class RecordingObserver : public moe::TrainObserver {
 public:
  explicit RecordingObserver(recorder::RecordOptions options) : options_(std::move(options)) {}
  ~RecordingObserver() override;
  // A rank of a multi-rank run: its collectives are recorded too, and rank 0
  // writes the world manifest into `run_dir` as the recording starts.
  void set_rank(moe::Parallel* parallel, std::string run_dir) {
    parallel_ = parallel;
    run_dir_ = std::move(run_dir);
  }

  // The fault the run was trained with, annotated as "fault"
  // (replayer::FaultAnnotation): what a replay on other ranks judges.
  void set_fault(llvm::json::Object fault) { fault_ = std::move(fault); }

  absl::Status OnStart(moe::GrpoTrainer& trainer) override;
  absl::Status BeforeStep(int64_t step) override;
  absl::Status AfterStep(const moe::StepMetrics& m, double loss_scale) override;
  absl::Status OnFinish() override;
  const recorder::Recorder& recorder() const { return *rec_; }
  bool started() const { return rec_ != nullptr; }

 private:
  recorder::RecordOptions options_;
  std::unique_ptr<recorder::Recorder> rec_;
  moe::GrpoTrainer* trainer_ = nullptr;
  moe::Parallel* parallel_ = nullptr;
  std::string run_dir_;
  llvm::json::Object fault_;
};

}  // namespace moerr::world
