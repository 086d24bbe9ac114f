// A training run of the reference model, as `moerr train` performs it:
// supervised warm-up (or a given checkpoint), a fault if asked, then GRPO
// steps. Writes per-step metrics as JSONL and HF-layout checkpoints.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/fault.h"
#include "moe/grpo_trainer.h"
#include "moe/warmup.h"

namespace moerr::moe {

struct TrainOptions {
  std::string preset = "small";
  Family family = Family::kQwen3Moe;
  FaultKind fault = FaultKind::kNone;
  int64_t steps = 10;              // GRPO steps
  Precision precision = Precision::kFp32;
  bool fp16_saturate = false;      // fp16 emulation: overflow saturates to +-65504 instead of Inf
  int64_t micro_batch = 0;         // GrpoOptions::micro_batch
  uint64_t seed = 0;
  std::string out_dir;             // required
  std::string init_checkpoint;     // start from this HF checkpoint instead of warming up
  int64_t warmup_steps = 600;
  bool overwrite = false;
  // Expert and data parallelism (parallel.h); null: one process. Every rank
  // warms up the same model from the same seed, trains its slice of the
  // batch and its experts; at the end each EP group gathers its experts
  // (broadcast from their hosts) and rank 0 alone writes the metrics and
  // checkpoints and measures the accuracy.
  Parallel* parallel = nullptr;
  int64_t fault_rank = -1;         // with `parallel`: only this rank has the fault (FaultPlace); -1: every rank
};

struct TrainReport {
  WarmupReport warmup;             // accuracy 0 and loss 0 when started from a checkpoint
  double final_accuracy = 0;
  InjectedFault fault;
  std::vector<StepMetrics> steps;
  std::string metrics_path;        // OUT/metrics.jsonl
  std::string checkpoint_dir;      // OUT/checkpoint
};

// `progress(phase, done, total)` is called as work advances.
using ProgressFn = std::function<void(const std::string& phase, int64_t done, int64_t total)>;

// Sees the RL part of a run (a recorder, for one). Every call may fail the run.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  // After warm-up and fault injection, before the first RL step.
  // `trainer` outlives the observer's use of it (until OnFinish).
  virtual absl::Status OnStart(GrpoTrainer& trainer) = 0;
  virtual absl::Status BeforeStep(int64_t step) = 0;
  virtual absl::Status AfterStep(const StepMetrics& metrics, double loss_scale) = 0;
  virtual absl::Status OnFinish() = 0;
};

// Several observers as one, called in the order added; a call stops at the
// first error.
class TrainObservers : public TrainObserver {
 public:
  void Add(TrainObserver* o) {
    if (o != nullptr) list_.push_back(o);
  }
  absl::Status OnStart(GrpoTrainer& trainer) override {
    return Each([&](TrainObserver& o) { return o.OnStart(trainer); });
  }
  absl::Status BeforeStep(int64_t step) override {
    return Each([&](TrainObserver& o) { return o.BeforeStep(step); });
  }
  absl::Status AfterStep(const StepMetrics& metrics, double loss_scale) override {
    return Each([&](TrainObserver& o) { return o.AfterStep(metrics, loss_scale); });
  }
  absl::Status OnFinish() override {
    return Each([&](TrainObserver& o) { return o.OnFinish(); });
  }

 private:
  template <typename F>
  absl::Status Each(F&& f) {
    for (TrainObserver* o : list_) {
      if (absl::Status s = f(*o); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::vector<TrainObserver*> list_;
};

absl::StatusOr<TrainReport> RunTraining(const TrainOptions& options, const ProgressFn& progress = nullptr,
                                        TrainObserver* observer = nullptr);

// One JSON object per step: every StepMetrics field.
llvm::json::Object MetricsToJson(const StepMetrics& m);

}  // namespace moerr::moe
