// One recorded step of the reference trainer, in memory: what model replay
// needs (config, options, trainer state, routing decisions) and nothing else.
// `moerr reduce`'s passes transform it; WriteStepBundle writes it as a bundle
// model replay runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/world_run.h"
#include "moe/grpo_trainer.h"
#include "moe/moe_config.h"
#include "moe/moe_transformer.h"

namespace moerr::proxy {

struct RoutingEntry {
  int64_t layer = 0, micro_batch = 0;
  at::Tensor ids;      // [T, k] int64
  at::Tensor logits;   // [T, E] f32, or undefined
  // [T, k] f64 as recorded (expert statistics), or undefined once the ids
  // are mapped; WriteStepBundle derives the weights it writes from the logits.
  at::Tensor weights;
};

struct StepBundle {
  int64_t step = 0;
  moe::MoeConfig config;
  moe::GrpoOptions options;
  moe::TrainerState state;           // tensors owned (copies)
  std::vector<RoutingEntry> routing;  // empty: the replay routes live
  llvm::json::Object metrics;         // the original step's, when recorded
  // The responses the step trains on ([sequences, tokens] int64), when they
  // were recorded (replayer::RecordTrainerBatch): a run's, which replay on
  // other ranks feeds instead of sampling; written back the same way.
  at::Tensor responses;
  // The global batch's prompts and answers when they are not the sampler's
  // draw (a proxy keeping some ranks' shards); written as batch/prompts and
  // batch/answers.
  at::Tensor prompts, answers;
  // (layer, expert) the failure is in; passes keep it and follow its index.
  std::vector<std::pair<int64_t, int64_t>> implicated;
};

// Step `step` of `reader`, read once: the trainer's state at its start
// (replayer::LoadTrainer), its recorded routing and metrics. `trace`: the
// step's, when the caller has read it. `source` names the bundle in errors.
absl::StatusOr<StepBundle> LoadStepBundle(const formats::BundleReader& reader, int64_t step,
                                          const std::string& source = "the bundle");
absl::StatusOr<StepBundle> LoadStepBundle(const formats::BundleReader& reader, int64_t step,
                                          const formats::Trace& trace, const std::string& source = "the bundle");

// Step `world.step` of a multi-rank run as one process's step: rank
// `experts_of`'s config, options and dense state (a router may differ
// between ranks) with every expert's state from the rank
// of the EP group of `experts_of` that hosted it (replayer::LoadWorldTrainer;
// replicas may differ), every rank's routing concatenated in rank order
// decision by decision, the world's responses, rank 0's metrics (world
// totals).
absl::StatusOr<StepBundle> LoadWorldStepBundle(const formats::WorldStep& world, int64_t experts_of = 0);

// A world's step (LoadWorldStepBundle: the batch in rank order, `ranks`
// equal shards) reduced to the shards of the ranks `kept`, in that order:
// each routing decision's and the responses' rows, the prompts and answers
// of the sampler's draw at the step (set as the bundle's own), and the
// prompt count. The trainer state and metrics are kept.
absl::StatusOr<StepBundle> KeepShards(const StepBundle& world, int64_t ranks, const std::vector<int64_t>& kept);

// The bundle's policy: a model of its config holding its "policy/" weights.
absl::StatusOr<moe::MoeTransformer> LoadPolicy(const StepBundle& bundle);
// `annotations`: step-less extras ("proxy": how it was made).
absl::Status WriteStepBundle(const StepBundle& bundle, const std::string& path,
                             const llvm::json::Object& annotations = {});

// A tensor of the state by name (with or without its "policy/" prefix) to
// its new name and value; nullopt drops it.
using TensorMap =
    std::function<std::optional<std::pair<std::string, at::Tensor>>(const std::string& name, const at::Tensor& t)>;
// `state` with every tensor mapped and Adam's per-parameter steps renamed
// the same way.
moe::TrainerState MapTrainerState(const moe::TrainerState& state, const TensorMap& map);

// Policy parameters of the bundle's model.
int64_t ParameterCount(const StepBundle& bundle);

}  // namespace moerr::proxy
