// Model replay (DESIGN.md, "Replay"): rebuild the reference model and its GRPO
// trainer from a bundle (config, options, weights, Adam moments, sampler
// state), force the recorded routing, and run the step again. Unlike program
// replay it re-runs the program, not its recorded ops, so it works where op
// shapes change (a proxy with fewer experts) and under other numerics.
//
// What it needs is written while recording by RecordTrainerStart (once) and
// RecordTrainerStep (at each step's start): annotations "model_config",
// "grpo_options", "trainer_state" and, outside `stats` mode, the state's
// tensors as "state/<name>" (content-addressed, so weights the trace already
// stores as leaves cost no bytes).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_writer.h"
#include "formats/trace.h"
#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"
#include "replayer/model_replay_report.h"

namespace moerr::replayer {

// Step-less: the model config and the trainer's options.
absl::Status RecordTrainerStart(recorder::Recorder& rec, const moe::GrpoTrainer& trainer);
// Between StepBegin and the step: the trainer's state (tensors outside stats mode).
absl::Status RecordTrainerStep(recorder::Recorder& rec, const moe::GrpoTrainer& trainer);

// What a bundle holds of the trainer at the start of `step`: the model
// config, the options, the state's scalars and its tensors ("policy/...",
// "reference/...", "exp_avg/...", "exp_avg_sq/..."), whose views point into
// `owned` (a move keeps them valid).
struct TrainerInputs {
  moe::MoeConfig config;
  moe::GrpoOptions options;
  llvm::json::Object scalars;
  std::vector<formats::OwnedTensor> owned;
  std::map<std::string, formats::TensorView> tensors;
};
absl::StatusOr<TrainerInputs> ReadTrainerInputs(const formats::BundleReader& reader, int64_t step);

// The trainer `inputs` describe (numerics replaced when given).
absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> BuildTrainer(const TrainerInputs& inputs,
                                                               std::optional<moe::Numerics> numerics = std::nullopt);

// The trainer as it was at the start of `step`: model config and options of
// the bundle (numerics replaced when given), weights, Adam moments, sampler.
absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> LoadTrainer(const formats::BundleReader& reader, int64_t step,
                                                              std::optional<moe::Numerics> numerics = std::nullopt);

// A step's recorded routing decisions by layer, in the order the layer made
// them (micro-batch order): [tokens, k] int64 expert ids each.
using RoutingQueues = std::map<int64_t, std::vector<at::Tensor>>;
absl::StatusOr<RoutingQueues> ReadRouting(const formats::BundleReader& reader, const formats::Trace& trace,
                                          int64_t step);

// After the step, outside `stats` mode: the responses the step trained on
// ("batch/responses", [sequences, response tokens] int64, this rank's
// shard), so that a replay on other ranks can train on them without
// sampling them again (a rank's rollout depends on its rank).
absl::Status RecordTrainerBatch(recorder::Recorder& rec, const moe::GrpoTrainer& trainer);
// The tensor name RecordTrainerBatch writes.
inline constexpr const char* kResponsesTensor = "batch/responses";
// A proxy's global batch when it keeps some ranks' shards of the recorded
// one (the trainer's sampler would draw another): prompts and answers
// [prompts, length] int64, served by GrpoTrainer::set_batch_source.
inline constexpr const char* kPromptsTensor = "batch/prompts";
inline constexpr const char* kAnswersTensor = "batch/answers";

// One step of `trainer` recorded as step `step`: StepBegin, the trainer
// state, the step, its "metrics" annotation, StepEnd.
absl::StatusOr<moe::StepMetrics> RecordStep(recorder::Recorder& rec, moe::GrpoTrainer& trainer, int64_t step);

// What RecordTrainerStart and RecordTrainerStep write, for a bundle made
// without running the trainer (a proxy): the config, options and `state` at
// `step` (tensors are copied at once).
absl::Status WriteTrainer(formats::BundleWriter& writer, const moe::MoeConfig& config, const moe::GrpoOptions& options,
                          int64_t step, const moe::TrainerState& state);

struct ModelReplayOptions {
  c10::Device device = c10::kCPU;
  bool routing_replay = true;              // false: route live (agreement is still measured)
  std::optional<moe::Numerics> numerics;   // train and roll out in these instead of the recorded ones
  std::string record_path;                 // required: the replayed step is recorded here
  recorder::CaptureMode record_mode = recorder::CaptureMode::kStats;
  bool overwrite = false;
  llvm::json::Object annotations;          // step-less, added to the recording (a proxy's "proxy")
};

absl::StatusOr<ModelReplayReport> ReplayModelStep(const formats::BundleReader& reader, int64_t step,
                                                  const ModelReplayOptions& options);

// The core of ReplayModelStep on a trainer already loaded: runs its next
// step as step `step` with `routing` served to (or, routing_replay false,
// compared with) its policy's routers, recorded to options.record_path.
// With `parallel`, the recorder also observes its collectives. Sets the
// report's metrics, seconds, CPU seconds and routing counts; the recording
// gets them as the step's "replay_time" annotation ({"seconds", "cpu_seconds"}).
absl::StatusOr<ModelReplayReport> ReplayTrainerStep(moe::GrpoTrainer& trainer, RoutingQueues routing, int64_t step,
                                                    const ModelReplayOptions& options, moe::Parallel* parallel = nullptr);

}  // namespace moerr::replayer
