#include "replayer/model_replay.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_format.h"
#include "formats/annotations.h"
#include "formats/trace.h"
#include "moe/moe_config.h"
#include "moe/training_run.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/seconds_since.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::replayer {
namespace {

constexpr const char* kStatePrefix = "state/";

// CPU seconds this process has used, every thread counted.
double ProcessCpuSeconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Serves a step's recorded routing decisions in order, per layer, and counts
// how often the live router agrees with them.
class RecordedRouting : public recorder::RoutingSource {
 public:
  RecordedRouting(std::map<int64_t, std::vector<at::Tensor>> by_layer, bool force)
      : by_layer_(std::move(by_layer)), force_(force) {}

  at::Tensor Route(int64_t layer, const at::Tensor& live, int64_t num_experts) override {
    at::DisableRecordFunctionGuard no_record;  // not the model's ops
    ++report_.decisions;
    std::vector<at::Tensor>& queue = by_layer_[layer];
    size_t& next = next_[layer];
    if (next >= queue.size()) return Miss(live, absl::StrFormat("layer %d, decision %d: none recorded", layer, next));
    const at::Tensor& ids = queue[next++];
    if (ids.sizes() != live.sizes()) {
      return Miss(live, absl::StrFormat("layer %d, decision %d: recorded for %d tokens x %d, the replay routes %d x %d",
                                        layer, next - 1, ids.size(0), ids.dim() > 1 ? ids.size(1) : 0, live.size(0),
                                        live.size(1)));
    }
    if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= num_experts)) {
      return Miss(live, absl::StrFormat("layer %d, decision %d: recorded expert ids outside [0, %d)", layer, next - 1,
                                        num_experts));
    }
    report_.slots += live.numel();
    report_.live_agree += live.unsqueeze(2).eq(ids.unsqueeze(1)).any(2).sum().item<int64_t>();
    if (!force_) return live;
    ++report_.forced;
    return ids;
  }

  const ModelReplayReport& counts() const { return report_; }

 private:
  at::Tensor Miss(const at::Tensor& live, std::string problem) {
    if (report_.routing_problem.empty()) report_.routing_problem = std::move(problem);
    return live;
  }

  std::map<int64_t, std::vector<at::Tensor>> by_layer_;
  std::map<int64_t, size_t> next_;
  bool force_;
  ModelReplayReport report_;  // decisions, forced, slots, live_agree, routing_problem
};

absl::StatusOr<llvm::json::Object> ReadObject(const formats::BundleReader& reader, const char* key, int64_t step) {
  absl::StatusOr<llvm::json::Object> value = formats::ReadObjectAnnotation(reader, key, step, "");
  if (absl::IsNotFound(value.status())) {
    return Annotate(value.status(), "model replay needs a bundle recorded from the reference trainer");
  }
  return value;
}

// A state tensor's role: weights, or Adam moments.
formats::Role StateRole(const std::string& name) {
  const bool weight = name.rfind("policy/", 0) == 0 || name.rfind("reference/", 0) == 0;
  return weight ? formats::Role::kParameter : formats::Role::kOptimizerState;
}

}  // namespace

absl::Status RecordTrainerStart(recorder::Recorder& rec, const moe::GrpoTrainer& trainer) {
  MOERR_RETURN_IF_ERROR(rec.Annotate(formats::kModelConfigAnnotation, moe::ToHfConfig(trainer.policy()->config())));
  return rec.Annotate(formats::kGrpoOptionsAnnotation, moe::ToJson(trainer.options()));
}

absl::Status RecordTrainerStep(recorder::Recorder& rec, const moe::GrpoTrainer& trainer) {
  moe::TrainerState state = trainer.SaveState();
  MOERR_RETURN_IF_ERROR(rec.AnnotateStep(formats::kTrainerStateAnnotation, std::move(state.scalars)));
  if (rec.mode() == recorder::CaptureMode::kStats) return absl::OkStatus();
  at::DisableRecordFunctionGuard no_record;
  for (auto& [name, t] : state.tensors) {
    // A copy: the step about to run changes these tensors in place.
    rec.OnTensorBytes(kStatePrefix + name, StateRole(name), t.detach().clone());
  }
  return absl::OkStatus();
}

absl::Status RecordTrainerBatch(recorder::Recorder& rec, const moe::GrpoTrainer& trainer) {
  if (rec.mode() == recorder::CaptureMode::kStats || !trainer.last_batch().responses.defined()) {
    return absl::OkStatus();
  }
  at::DisableRecordFunctionGuard no_record;
  rec.OnTensorBytes(kResponsesTensor, formats::Role::kOther, trainer.last_batch().responses.to(at::kLong).contiguous());
  return absl::OkStatus();
}

absl::StatusOr<moe::StepMetrics> RecordStep(recorder::Recorder& rec, moe::GrpoTrainer& trainer, int64_t step) {
  MOERR_RETURN_IF_ERROR(rec.StepBegin(step));
  MOERR_RETURN_IF_ERROR(RecordTrainerStep(rec, trainer));
  const moe::StepMetrics m = trainer.Step();
  MOERR_RETURN_IF_ERROR(RecordTrainerBatch(rec, trainer));
  MOERR_RETURN_IF_ERROR(rec.AnnotateStep(formats::kMetricsAnnotation, moe::MetricsToJson(m)));
  MOERR_RETURN_IF_ERROR(rec.StepEnd(step, {m.loss, m.grad_norm}));
  return m;
}

absl::Status WriteTrainer(formats::BundleWriter& writer, const moe::MoeConfig& config, const moe::GrpoOptions& options,
                          int64_t step, const moe::TrainerState& state) {
  MOERR_RETURN_IF_ERROR(writer.Annotate(formats::kModelConfigAnnotation, moe::ToHfConfig(config)));
  MOERR_RETURN_IF_ERROR(writer.Annotate(formats::kGrpoOptionsAnnotation, moe::ToJson(options)));
  MOERR_RETURN_IF_ERROR(writer.Annotate(formats::kTrainerStateAnnotation, llvm::json::Object(state.scalars), step));
  for (const auto& [name, t] : state.tensors) {
    const at::Tensor copy = t.detach().contiguous();
    MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(copy));
    MOERR_RETURN_IF_ERROR(writer.PutTensor(kStatePrefix + name, StateRole(name), step, view));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainerInputs> ReadTrainerInputs(const formats::BundleReader& reader, int64_t step) {
  const std::vector<int64_t> complete = reader.CompleteSteps();
  if (std::find(complete.begin(), complete.end(), step) == complete.end()) {
    return absl::NotFoundError(absl::StrFormat("step %d is not a complete step of the bundle", step));
  }
  TrainerInputs in;
  MOERR_ASSIGN_OR_RETURN(llvm::json::Object config_json, ReadObject(reader, formats::kModelConfigAnnotation, -1));
  MOERR_ASSIGN_OR_RETURN(llvm::json::Object grpo_json, ReadObject(reader, formats::kGrpoOptionsAnnotation, -1));
  MOERR_ASSIGN_OR_RETURN(in.scalars, ReadObject(reader, formats::kTrainerStateAnnotation, step));
  MOERR_ASSIGN_OR_RETURN(in.config, moe::FromHfConfig(config_json));
  MOERR_ASSIGN_OR_RETURN(in.options, moe::GrpoOptionsFromJson(grpo_json));
  const std::string prefix = kStatePrefix;
  for (const formats::TensorInfo& info : reader.index().tensors) {
    if (info.step != step || info.name.rfind(prefix, 0) != 0) continue;
    MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor t, reader.ReadBlob(info.blob));
    in.owned.push_back(std::move(t));
    in.tensors[info.name.substr(prefix.size())] = in.owned.back().view();
  }
  if (in.tensors.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d holds no model state: model replay needs a bundle recorded in replayable or full mode", step));
  }
  return in;
}

absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> BuildTrainer(const TrainerInputs& in,
                                                               std::optional<moe::Numerics> numerics) {
  moe::GrpoOptions grpo = in.options;
  if (numerics) grpo.numerics = grpo.rollout_numerics = *numerics;
  std::unique_ptr<moe::GrpoTrainer> trainer;
  MOERR_RETURN_IF_ERROR(CatchTorch("rebuilding the trainer", [&]() -> absl::Status {
    moe::MoeTransformer policy(in.config), reference(in.config);
    trainer = std::make_unique<moe::GrpoTrainer>(policy, reference, moe::AdditionTask(), grpo, /*seed=*/0);
    return trainer->RestoreState(in.scalars, in.tensors);  // sets the seed too
  }));
  return trainer;
}

absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> LoadTrainer(const formats::BundleReader& reader, int64_t step,
                                                              std::optional<moe::Numerics> numerics) {
  MOERR_ASSIGN_OR_RETURN(const TrainerInputs inputs, ReadTrainerInputs(reader, step));
  return BuildTrainer(inputs, numerics);
}

absl::StatusOr<RoutingQueues> ReadRouting(const formats::BundleReader& reader, const formats::Trace& trace,
                                          int64_t step) {
  std::vector<const formats::RoutingRecord*> records;
  for (const formats::RoutingRecord& r : trace.routing) records.push_back(&r);
  std::stable_sort(records.begin(), records.end(), [](const auto* a, const auto* b) {
    return std::tie(a->layer, a->micro_batch) < std::tie(b->layer, b->micro_batch);
  });
  RoutingQueues by_layer;
  MOERR_RETURN_IF_ERROR(CatchTorch("reading the routing", [&]() -> absl::Status {
    for (const formats::RoutingRecord* r : records) {
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor ids, reader.ReadTensor(r->topk_ids, step));
      if (ids.shape.size() != 2) {
        return absl::InvalidArgumentError(absl::StrFormat("%s: expected [tokens, k] ids", r->topk_ids));
      }
      by_layer[r->layer].push_back(recorder::ToTensor(ids.view()).to(at::kLong));
    }
    return absl::OkStatus();
  }));
  return by_layer;
}

absl::StatusOr<ModelReplayReport> ReplayTrainerStep(moe::GrpoTrainer& trainer, RoutingQueues by_layer, int64_t step,
                                                    const ModelReplayOptions& options, moe::Parallel* parallel) {
  if (options.record_path.empty()) return absl::InvalidArgumentError("model replay: a path to record the replay to is required");
  ModelReplayReport report;
  MOERR_RETURN_IF_ERROR(CatchTorch("model replay", [&]() -> absl::Status {
    RecordedRouting routing(std::move(by_layer), options.routing_replay);
    MOERR_ASSIGN_OR_RETURN(std::unique_ptr<recorder::Recorder> rec,
                           recorder::Recorder::Start(recorder::RecordOptions(options.record_path)
                                                         .set_mode(options.record_mode)
                                                         .set_overwrite(options.overwrite)
                                                         .set_crash_handler(false)));
    MOERR_RETURN_IF_ERROR(RecordTrainerStart(*rec, trainer));
    for (const auto& [key, value] : options.annotations) MOERR_RETURN_IF_ERROR(rec->Annotate(key.str(), value));
    moe::MoeTransformer& policy = trainer.policy();
    policy->SetRoutingObserver(rec.get());
    policy->SetRoutingSource(&routing);
    if (parallel != nullptr) parallel->AddObserver(rec.get());
    MOERR_RETURN_IF_ERROR(rec->StepBegin(step));
    MOERR_RETURN_IF_ERROR(RecordTrainerStep(*rec, trainer));
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuSeconds();
    report.metrics = trainer.Step();
    report.cpu_seconds = ProcessCpuSeconds() - cpu_start;
    report.seconds = SecondsSince(start);
    if (parallel != nullptr) parallel->RemoveObserver(rec.get());
    policy->SetRoutingSource(nullptr);
    policy->SetRoutingObserver(nullptr);
    MOERR_RETURN_IF_ERROR(RecordTrainerBatch(*rec, trainer));
    MOERR_RETURN_IF_ERROR(rec->AnnotateStep(formats::kMetricsAnnotation, moe::MetricsToJson(report.metrics)));
    MOERR_RETURN_IF_ERROR(rec->AnnotateStep(formats::kReplayTimeAnnotation,
                                            formats::ToJson(formats::ReplayTime{report.seconds, report.cpu_seconds})));
    MOERR_RETURN_IF_ERROR(rec->StepEnd(step, {report.metrics.loss, report.metrics.grad_norm}));
    MOERR_RETURN_IF_ERROR(rec->Stop());
    const ModelReplayReport& counts = routing.counts();
    report.decisions = counts.decisions;
    report.forced = counts.forced;
    report.slots = counts.slots;
    report.live_agree = counts.live_agree;
    report.routing_problem = counts.routing_problem;
    return absl::OkStatus();
  }));
  return report;
}

absl::StatusOr<ModelReplayReport> ReplayModelStep(const formats::BundleReader& reader, int64_t step,
                                                  const ModelReplayOptions& options) {
  if (options.device != c10::kCPU) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model replay on %s: the reference trainer samples its batch and rollouts on the CPU; replay on the CPU",
        options.device.str()));
  }
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<moe::GrpoTrainer> trainer, LoadTrainer(reader, step, options.numerics));
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
  MOERR_ASSIGN_OR_RETURN(RoutingQueues routing, ReadRouting(reader, trace, step));
  MOERR_ASSIGN_OR_RETURN(ModelReplayReport report, ReplayTrainerStep(*trainer, std::move(routing), step, options));
  report.recorded_decisions = static_cast<int64_t>(trace.routing.size());
  // A bundle without routing (a reduced batch) routes live by design.
  if (report.recorded_decisions == 0) report.routing_problem.clear();
  if (auto metrics = formats::ReadObjectAnnotation(reader, formats::kMetricsAnnotation, step, ""); metrics.ok()) {
    report.recorded_metrics = *std::move(metrics);
  }
  return report;
}

}  // namespace moerr::replayer
