#include "replayer/world_replay.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "formats/annotations.h"
#include "formats/module_path.h"
#include "moe/addition_task.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::replayer {

int64_t WorldReplayPlan::HostOf(int64_t rank, int64_t expert) const {
  const int64_t base = experts_of >= 0 ? experts_of : rank * covers();
  return base / original_ep * original_ep + expert / (experts / original_ep);
}

absl::StatusOr<WorldReplayPlan> PlanWorldReplay(const formats::WorldManifest& original, int64_t ranks) {
  WorldReplayPlan plan;
  plan.original_ranks = original.world_size;
  plan.original_ep = original.ep_size;
  plan.experts = original.experts;
  plan.ranks = ranks;
  if (plan.experts <= 0) {
    return absl::InvalidArgumentError(
        "the run records no expert layout (world.json has no experts): replay on other ranks rebuilds moerr's "
        "reference model, which needs it");
  }
  if (ranks < 1 || original.world_size % ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ranks %d must divide the run's %d ranks", ranks, original.world_size));
  }
  const int64_t k = plan.covers(), e = original.ep_size;
  if (e % k == 0) {
    plan.ep_size = e / k;
  } else if (k % e == 0) {
    plan.ep_size = 1;
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ranks %d: each replay rank would stand for %d ranks, which neither divides nor is a "
                        "multiple of the run's expert parallelism %d",
                        ranks, k, e));
  }
  return plan;
}

namespace {

absl::StatusOr<const formats::RankStep*> Original(const formats::WorldStep& world, int64_t rank) {
  const formats::RankStep& r = world.ranks.at(static_cast<size_t>(rank));
  if (!r.reader || !r.trace || !r.step_complete) {
    return absl::FailedPreconditionError(absl::StrFormat("%s, rank %d: step %d is not complete%s", world.dir, rank,
                                                         world.step,
                                                         r.error.ok() ? "" : ": " + std::string(r.error.message())));
  }
  return &r;
}

// The routed expert a parameter belongs to:
// "model.layers.0.mlp.experts.3.up_proj.weight" -> 3.
std::optional<int64_t> ExpertOfParameter(absl::string_view parameter) {
  const auto expert = formats::ExpertOf(parameter);
  if (!expert) return std::nullopt;
  return expert->second;
}

// The same for a state tensor: "policy/<parameter>", "exp_avg/<parameter>"...
std::optional<int64_t> ExpertOfState(absl::string_view name) {
  return ExpertOfParameter(name.substr(name.find('/') + 1));
}

// Rank m*k's state (experts_of's when named) with each expert's tensors and
// Adam steps taken from the rank that hosted it. `inputs` keeps every read rank's bytes alive.
absl::StatusOr<TrainerInputs*> MergedInputs(const formats::WorldStep& world, const WorldReplayPlan& plan, int64_t rank,
                                            std::map<int64_t, TrainerInputs>& inputs) {
  for (int64_t e = 0; e < plan.experts; ++e) {
    const int64_t host = plan.HostOf(rank, e);
    if (inputs.count(host) != 0) continue;
    MOERR_ASSIGN_OR_RETURN(const formats::RankStep* r, Original(world, host));
    MOERR_ASSIGN_OR_RETURN(inputs[host], ReadTrainerInputs(*r->reader, world.step));
  }
  // The dense state: the rank whose experts are loaded when one is named (a
  // proxy stands for the failing rank, whose router may be its own), else m*k.
  const int64_t base = plan.experts_of >= 0 ? plan.experts_of : rank * plan.covers();
  if (inputs.count(base) == 0) {
    MOERR_ASSIGN_OR_RETURN(const formats::RankStep* r, Original(world, base));
    MOERR_ASSIGN_OR_RETURN(inputs[base], ReadTrainerInputs(*r->reader, world.step));
  }
  TrainerInputs& merged = inputs.at(base);
  llvm::json::Object* adam = merged.scalars.getObject("adam_step");
  for (const auto& [host, in] : inputs) {
    if (host == base) continue;
    for (const auto& [name, view] : in.tensors) {
      const auto e = ExpertOfState(name);
      if (e && plan.HostOf(rank, *e) == host) merged.tensors[name] = view;
    }
    const llvm::json::Object* steps = in.scalars.getObject("adam_step");
    if (adam == nullptr || steps == nullptr) continue;
    for (const auto& [name, value] : *steps) {
      const auto e = ExpertOfParameter(name.str());
      if (e && plan.HostOf(rank, *e) == host) (*adam)[name] = value;
    }
  }
  return &merged;
}

// The step's routing of the original ranks replay rank `rank` stands for,
// concatenated in rank order, without the rollout's `rollout` decisions per
// layer (the replay does not sample).
absl::StatusOr<RoutingQueues> MergedRouting(const formats::WorldStep& world, const WorldReplayPlan& plan, int64_t rank,
                                            int64_t rollout) {
  std::vector<RoutingQueues> parts;
  for (int64_t r = rank * plan.covers(); r < (rank + 1) * plan.covers(); ++r) {
    MOERR_ASSIGN_OR_RETURN(const formats::RankStep* original, Original(world, r));
    MOERR_ASSIGN_OR_RETURN(RoutingQueues q, ReadRouting(*original->reader, *original->trace, world.step));
    for (auto& [layer, decisions] : q) {
      if (static_cast<int64_t>(decisions.size()) <= rollout) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s, rank %d, layer %d: %d routing decisions recorded, fewer than the rollout's %d and the step's",
            world.dir, r, layer, decisions.size(), rollout));
      }
      decisions.erase(decisions.begin(), decisions.begin() + rollout);
    }
    parts.push_back(std::move(q));
  }
  RoutingQueues merged;
  MOERR_RETURN_IF_ERROR(CatchTorch("merging the routing", [&]() -> absl::Status {
    for (const auto& [layer, decisions] : parts[0]) {
      for (size_t i = 0; i < decisions.size(); ++i) {
        std::vector<at::Tensor> rows;
        for (size_t p = 0; p < parts.size(); ++p) {
          const auto it = parts[p].find(layer);
          if (it == parts[p].end() || it->second.size() != decisions.size()) {
            return absl::InvalidArgumentError(
                absl::StrFormat("%s: ranks %d and %d recorded different routing decisions for layer %d", world.dir,
                                rank * plan.covers(), rank * plan.covers() + static_cast<int64_t>(p), layer));
          }
          rows.push_back(it->second[i]);
        }
        merged[layer].push_back(at::cat(rows, 0));
      }
    }
    return absl::OkStatus();
  }));
  return merged;
}

// A proxy's own global batch (batch/prompts and batch/answers, rank 0's),
// when it has one, served in place of the sampler's draw.
absl::Status ServeRecordedBatch(const formats::WorldStep& world, moe::GrpoTrainer& trainer) {
  const formats::BundleReader& reader = *world.ranks[0].reader;
  absl::StatusOr<formats::OwnedTensor> prompts = reader.ReadTensor(kPromptsTensor, world.step);
  if (!prompts.ok()) return absl::OkStatus();  // the sampler draws the recorded batch again
  MOERR_ASSIGN_OR_RETURN(const formats::OwnedTensor answers, reader.ReadTensor(kAnswersTensor, world.step));
  moe::AdditionTask::Batch batch{recorder::ToTensor(prompts->view()).to(at::kLong),
                                 recorder::ToTensor(answers.view()).to(at::kLong)};
  if (batch.prompts.size(0) != trainer.options().prompts || batch.answers.size(0) != trainer.options().prompts) {
    return absl::InvalidArgumentError(absl::StrFormat("%s, step %d: %s holds %d prompts, the options %d", world.dir,
                                                      world.step, kPromptsTensor, batch.prompts.size(0),
                                                      trainer.options().prompts));
  }
  trainer.set_batch_source([batch](int64_t) { return batch; });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> WorldResponses(const formats::WorldStep& world) {
  std::vector<at::Tensor> shards;
  for (int64_t r = 0; r < static_cast<int64_t>(world.ranks.size()); ++r) {
    MOERR_ASSIGN_OR_RETURN(const formats::RankStep* original, Original(world, r));
    absl::StatusOr<formats::OwnedTensor> t = original->reader->ReadTensor(kResponsesTensor, world.step);
    if (!t.ok()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s, rank %d: step %d records no responses (\"%s\"): replay on other ranks needs a run "
                          "recorded in replayable or full mode by this version of moerr train --record",
                          world.dir, r, world.step, kResponsesTensor));
    }
    shards.push_back(recorder::ToTensor(t->view()).to(at::kLong));
  }
  return at::cat(shards, 0);
}

absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> LoadWorldTrainer(const formats::WorldStep& world,
                                                                   const WorldReplayPlan& plan, int64_t rank) {
  std::map<int64_t, TrainerInputs> inputs;
  MOERR_ASSIGN_OR_RETURN(TrainerInputs * merged, MergedInputs(world, plan, rank, inputs));
  return BuildTrainer(*merged);
}

absl::StatusOr<ModelReplayReport> ReplayWorldRank(const formats::WorldStep& world, const WorldReplayPlan& plan,
                                                  int64_t rank, moe::Parallel* parallel,
                                                  const WorldReplayOptions& options) {
  if ((plan.ranks == 1) != (parallel == nullptr) ||
      (parallel != nullptr && (parallel->layout().rank != rank || parallel->layout().world_size != plan.ranks ||
                               parallel->layout().ep_size != plan.ep_size))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "replay rank %d: the world joined is not the plan's (%d ranks, EP %d)", rank, plan.ranks, plan.ep_size));
  }
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<moe::GrpoTrainer> trainer, LoadWorldTrainer(world, plan, rank));
  at::Tensor responses;
  RoutingQueues routing;
  MOERR_RETURN_IF_ERROR(CatchTorch("preparing the replay", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(responses, WorldResponses(world));
    trainer->set_response_source([responses](int64_t, const at::Tensor&) { return responses; });
    MOERR_RETURN_IF_ERROR(ServeRecordedBatch(world, *trainer));
    if (parallel != nullptr) MOERR_RETURN_IF_ERROR(trainer->set_parallel(parallel));
    const int64_t rollout = moe::ResponseTokens(trainer->options(), moe::AdditionTask());
    MOERR_ASSIGN_OR_RETURN(routing, MergedRouting(world, plan, rank, rollout));
    return absl::OkStatus();
  }));
  int64_t decisions = 0;
  for (const auto& [layer, queue] : routing) decisions += static_cast<int64_t>(queue.size());
  ModelReplayOptions model;
  model.record_path = options.record_path;
  model.record_mode = options.record_mode;
  model.overwrite = options.overwrite;
  model.annotations = options.annotations;
  MOERR_ASSIGN_OR_RETURN(ModelReplayReport report,
                         ReplayTrainerStep(*trainer, std::move(routing), world.step, model, parallel));
  report.recorded_decisions = decisions;
  const formats::BundleReader& base = *world.ranks[static_cast<size_t>(rank * plan.covers())].reader;
  if (auto metrics = formats::ReadObjectAnnotation(base, formats::kMetricsAnnotation, world.step, world.dir);
      metrics.ok()) {
    report.recorded_metrics = *std::move(metrics);
  }
  return report;
}

}  // namespace moerr::replayer
