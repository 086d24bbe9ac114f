#include "moe/training_run.h"

#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_format.h"
#include "formats/json_number.h"
#include "moe/checkpoint.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::moe {
llvm::json::Object MetricsToJson(const StepMetrics& m) {
  const auto& num = formats::JsonNumberOrName;
  return llvm::json::Object{{"step", m.step},
                            {"loss", num(m.loss)},
                            {"reward", num(m.reward)},
                            {"kl", num(m.kl)},
                            {"grad_norm", num(m.grad_norm)},
                            {"loss_scale", num(m.loss_scale)},
                            {"load_entropy", num(m.load_entropy)},
                            {"top_expert_share", num(m.top_expert_share)},
                            {"clip_fraction", num(m.clip_fraction)},
                            {"ratio_error", num(m.ratio_error)},
                            {"skipped", m.skipped},
                            {"finite", m.finite}};
}

namespace {

// Every expert's weights from the EP rank hosting it, so each rank of an EP
// group holds the whole model again.
void GatherExperts(MoeTransformer& model, Parallel& parallel) {
  torch::NoGradGuard no_grad;
  const ParallelLayout& layout = parallel.layout();
  const int64_t experts = model->config().num_experts;
  for (MoeLayer layer : model->MoeLayers()) {
    for (int64_t e = 0; e < experts; ++e) {
      for (at::Tensor p : layer->expert(e)->parameters()) {
        parallel.Broadcast(p, CommGroup::kExpertParallel, layout.host_of(e, experts));
      }
    }
  }
}

// Rank 0's weights on every rank, as DDP does at construction: the ranks
// start from one model whatever their warm-up did.
void BroadcastFromRankZero(MoeTransformer& model, Parallel& parallel) {
  torch::NoGradGuard no_grad;
  for (at::Tensor t : model->parameters()) parallel.Broadcast(t, CommGroup::kWorld, 0);
  for (at::Tensor t : model->buffers()) parallel.Broadcast(t, CommGroup::kWorld, 0);
}

// The model the RL steps start from: the checkpoint, or the preset warmed
// up (after checking that the world can split it: a warm-up it could not use
// would be wasted).
absl::StatusOr<MoeTransformer> ModelToTrain(const TrainOptions& options, const GrpoOptions& grpo,
                                            const AdditionTask& task, const ProgressFn& progress,
                                            TrainReport& report) {
  if (!options.init_checkpoint.empty()) return LoadCheckpoint(options.init_checkpoint);
  MOERR_ASSIGN_OR_RETURN(MoeConfig config, Preset(options.preset, options.family));
  if (options.parallel != nullptr) {
    MOERR_RETURN_IF_ERROR(GrpoTrainer::CheckParallel(grpo, config, options.parallel->layout()));
  }
  MoeTransformer policy(config);
  WarmupOptions warm;
  warm.steps = options.warmup_steps;
  warm.seed = options.seed;
  report.warmup = Warmup(policy, task, warm, [&](int64_t step, double) {
    if (progress) progress("warm-up", step + 1, warm.steps);
  });
  return policy;
}

// The fault of the run; with --fault-rank, on that rank's weights and experts only.
absl::StatusOr<InjectedFault> InjectRunFault(const TrainOptions& options, const AdditionTask& task,
                                             MoeTransformer& policy, GrpoOptions& grpo) {
  std::mt19937_64 rng(options.seed + 17);
  const AdditionTask::Batch calib = task.Sample(64, rng);
  const at::Tensor calibration = at::cat({calib.prompts, calib.answers}, 1);
  const bool one_rank = options.parallel != nullptr && options.fault_rank >= 0;
  FaultPlace place;
  if (one_rank) {
    const ParallelLayout& layout = options.parallel->layout();
    const ParallelLayout target{options.fault_rank, layout.world_size, layout.ep_size};
    const int64_t experts = policy->config().num_experts;
    place = FaultPlace{target.first_local_expert(experts), target.local_experts(experts),
                       layout.rank == options.fault_rank};
  }
  MOERR_ASSIGN_OR_RETURN(InjectedFault fault, InjectFault(options.fault, policy, grpo, calibration, place));
  if (one_rank) fault.description += absl::StrFormat(" (on rank %d only)", options.fault_rank);
  return fault;
}

// The RL steps, each observed and (by the writer) appended to metrics.jsonl.
absl::Status RunSteps(const TrainOptions& options, GrpoTrainer& trainer, TrainObserver* observer,
                      const ProgressFn& progress, bool writer, TrainReport& report) {
  std::ofstream metrics;
  if (writer) {
    metrics.open(report.metrics_path, std::ios::trunc);
    if (!metrics) return absl::UnavailableError("cannot write " + report.metrics_path);
  }
  if (observer) MOERR_RETURN_IF_ERROR(observer->OnStart(trainer));
  for (int64_t i = 0; i < options.steps; ++i) {
    if (observer) MOERR_RETURN_IF_ERROR(observer->BeforeStep(i));
    report.steps.push_back(trainer.Step());
    if (observer) MOERR_RETURN_IF_ERROR(observer->AfterStep(report.steps.back(), trainer.loss_scale()));
    if (writer) {
      metrics << llvm::formatv("{0}", llvm::json::Value(MetricsToJson(report.steps.back()))).str() << "\n";
      metrics.flush();
    }
    if (progress) progress("RL", i + 1, options.steps);
  }
  return observer ? observer->OnFinish() : absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainReport> RunTraining(const TrainOptions& options, const ProgressFn& progress,
                                        TrainObserver* observer) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required (-o DIR)");
  if (options.steps < 0 || options.warmup_steps < 0) return absl::InvalidArgumentError("step counts must be >= 0");
  struct stat st;
  if (::stat(options.out_dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat("-o %s: a file of that name exists", options.out_dir));
  }
  TrainReport report;
  report.metrics_path = options.out_dir + "/metrics.jsonl";
  report.checkpoint_dir = options.out_dir + "/checkpoint";
  const bool writer = options.parallel == nullptr || options.parallel->layout().rank == 0;
  // Every rank checks (they share the host), so none warms up for a run
  // that rank 0 refuses.
  if (!options.overwrite && ::stat(report.metrics_path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrFormat("%s exists; pass --force to overwrite", report.metrics_path));
  }
  if (options.fp16_saturate && options.precision == Precision::kFp16) {
    return absl::InvalidArgumentError(
        "fp16 overflow that saturates needs fp16-emu: a native fp16 op gives Inf, and no CPU op saturates");
  }
  const AdditionTask task;
  absl::Status status = CatchTorch("training", [&]() -> absl::Status {
    torch::manual_seed(options.seed);
    GrpoOptions grpo;
    grpo.numerics = Numerics{options.precision, options.fp16_saturate};
    grpo.rollout_numerics = grpo.numerics;
    grpo.micro_batch = options.micro_batch;
    MOERR_ASSIGN_OR_RETURN(MoeTransformer policy, ModelToTrain(options, grpo, task, progress, report));
    // Made once the model is read or built: a checkpoint or preset that
    // cannot be had leaves no empty output directory behind.
    MOERR_RETURN_IF_ERROR(MakeDirectory(options.out_dir));
    if (writer && options.init_checkpoint.empty()) {
      MOERR_RETURN_IF_ERROR(SaveCheckpoint(policy, options.out_dir + "/warmup", options.overwrite));
    }
    if (options.parallel != nullptr) BroadcastFromRankZero(policy, *options.parallel);
    MoeTransformer reference = CopyOf(policy);
    MOERR_ASSIGN_OR_RETURN(report.fault, InjectRunFault(options, task, policy, grpo));
    GrpoTrainer trainer(policy, reference, task, grpo, options.seed);
    MOERR_RETURN_IF_ERROR(trainer.set_parallel(options.parallel));
    MOERR_RETURN_IF_ERROR(RunSteps(options, trainer, observer, progress, writer, report));
    if (options.parallel != nullptr) {
      GatherExperts(policy, *options.parallel);
      MOERR_RETURN_IF_ERROR(trainer.set_parallel(nullptr));
    }
    if (!writer) return absl::OkStatus();
    report.final_accuracy = Accuracy(policy, task, 256, options.seed + 1);
    return SaveCheckpoint(policy, report.checkpoint_dir, options.overwrite);
  });
  if (!status.ok()) return status;
  return report;
}

}  // namespace moerr::moe
