#include "proxy/step_bundle.h"

#include <ATen/ATen.h>

#include <random>
#include <sstream>

#include "absl/strings/str_format.h"
#include "moe/addition_task.h"
#include "formats/annotations.h"
#include "formats/bundle_writer.h"
#include "formats/trace.h"
#include "moe/checkpoint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/model_replay.h"
#include "replayer/world_replay.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::proxy {

absl::StatusOr<StepBundle> LoadStepBundle(const formats::BundleReader& reader, int64_t step,
                                          const std::string& source) {
  absl::StatusOr<formats::Trace> trace = formats::ReadTrace(reader, step);
  if (!trace.ok()) return Annotate(trace.status(), absl::StrFormat("%s, step %d", source, step));
  return LoadStepBundle(reader, step, *trace, source);
}

namespace {

// The step's routing decisions in recording order (per layer, micro-batch
// order), with their weights and, when captured, logits.
absl::StatusOr<std::vector<RoutingEntry>> ReadRoutingEntries(const formats::BundleReader& reader, int64_t step,
                                                             const formats::Trace& trace, const std::string& where) {
  // Reads tensor `name` of the step's routing of `layer`.
  auto read = [&](const std::string& name, int64_t layer) -> absl::StatusOr<at::Tensor> {
    absl::StatusOr<formats::OwnedTensor> t = reader.ReadTensor(name, step);
    if (!t.ok()) return Annotate(t.status(), absl::StrFormat("%s, layer %d routing, tensor %s", where, layer, name));
    return recorder::ToTensor(t->view());
  };
  std::vector<RoutingEntry> out;
  MOERR_RETURN_IF_ERROR(CatchTorch(where + ", routing", [&]() -> absl::Status {
    for (const formats::RoutingRecord& r : trace.routing) {
      RoutingEntry e{r.layer, r.micro_batch, {}, {}, {}};
      MOERR_ASSIGN_OR_RETURN(e.ids, read(r.topk_ids, r.layer));
      e.ids = e.ids.to(at::kLong);
      MOERR_ASSIGN_OR_RETURN(e.weights, read(r.topk_weights, r.layer));
      e.weights = e.weights.to(at::kDouble);
      if (!r.logits.empty()) {
        MOERR_ASSIGN_OR_RETURN(e.logits, read(r.logits, r.layer));
        e.logits = e.logits.to(at::kFloat);
      }
      out.push_back(std::move(e));
    }
    return absl::OkStatus();
  }));
  return out;
}

llvm::json::Object StepMetrics(const formats::BundleReader& reader, int64_t step) {
  absl::StatusOr<llvm::json::Object> m = formats::ReadObjectAnnotation(reader, formats::kMetricsAnnotation, step, "");
  return m.ok() ? *std::move(m) : llvm::json::Object{};
}

// Step `step` of `trainer`: its config, options and state (copies).
StepBundle FromTrainer(const moe::GrpoTrainer& trainer, int64_t step) {
  StepBundle b;
  b.step = step;
  b.config = trainer.policy()->config();
  b.options = trainer.options();
  b.state = trainer.SaveState();
  for (auto& [name, t] : b.state.tensors) t = t.detach().clone();
  return b;
}

// Entry i of every rank's routing, concatenated row-wise in rank order.
absl::StatusOr<std::vector<RoutingEntry>> ConcatRouting(const std::vector<std::vector<RoutingEntry>>& ranks,
                                                        const std::string& where) {
  std::vector<RoutingEntry> out = ranks.front();
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<at::Tensor> ids, weights, logits;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].size() != out.size() || ranks[r][i].layer != out[i].layer ||
          ranks[r][i].logits.defined() != out[i].logits.defined()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: ranks 0 and %d recorded different routing decisions", where, r));
      }
      if (ranks[r][i].ids.size(0) != out[i].ids.size(0)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: rank %d routed %d tokens in decision %d of layer %d, rank 0 %d: the ranks' shards differ", where, r,
            ranks[r][i].ids.size(0), i, out[i].layer, out[i].ids.size(0)));
      }
      ids.push_back(ranks[r][i].ids);
      weights.push_back(ranks[r][i].weights);
      if (out[i].logits.defined()) logits.push_back(ranks[r][i].logits);
    }
    out[i].ids = at::cat(ids, 0);
    out[i].weights = at::cat(weights, 0);
    if (!logits.empty()) out[i].logits = at::cat(logits, 0);
  }
  return out;
}

}  // namespace

absl::StatusOr<StepBundle> LoadStepBundle(const formats::BundleReader& reader, int64_t step,
                                          const formats::Trace& trace, const std::string& source) {
  const std::string where = absl::StrFormat("%s, step %d", source, step);
  absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> trainer = replayer::LoadTrainer(reader, step);
  if (!trainer.ok()) return Annotate(trainer.status(), where + ", trainer state");
  StepBundle b = FromTrainer(**trainer, step);
  MOERR_ASSIGN_OR_RETURN(b.routing, ReadRoutingEntries(reader, step, trace, where));
  b.metrics = StepMetrics(reader, step);
  return b;
}

absl::StatusOr<StepBundle> LoadWorldStepBundle(const formats::WorldStep& world, int64_t experts_of) {
  const std::string where = absl::StrFormat("%s, step %d", world.dir, world.step);
  MOERR_ASSIGN_OR_RETURN(replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(world.manifest, 1));
  plan.experts_of = experts_of;
  absl::StatusOr<std::unique_ptr<moe::GrpoTrainer>> trainer = replayer::LoadWorldTrainer(world, plan, 0);
  if (!trainer.ok()) return Annotate(trainer.status(), where + ", trainer state");
  StepBundle b = FromTrainer(**trainer, world.step);
  // First, as it checks that every rank completed the step (the trainer
  // needed only the ranks hosting the experts).
  MOERR_RETURN_IF_ERROR(CatchTorch(where + ", responses", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(b.responses, replayer::WorldResponses(world));
    return absl::OkStatus();
  }));
  std::vector<std::vector<RoutingEntry>> ranks;
  for (const formats::RankStep& r : world.ranks) {
    MOERR_ASSIGN_OR_RETURN(ranks.emplace_back(), ReadRoutingEntries(*r.reader, world.step, *r.trace,
                                                                    absl::StrFormat("%s, rank %d", where, r.rank)));
  }
  MOERR_RETURN_IF_ERROR(CatchTorch(where + ", routing", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(b.routing, ConcatRouting(ranks, where));
    return absl::OkStatus();
  }));
  b.metrics = StepMetrics(*world.ranks[0].reader, world.step);
  return b;
}

absl::StatusOr<StepBundle> KeepShards(const StepBundle& world, int64_t ranks, const std::vector<int64_t>& kept) {
  const int64_t prompts = world.options.prompts;
  if (ranks < 1 || prompts % ranks != 0 || kept.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%d prompts do not split into %d shards", prompts, ranks));
  }
  for (const RoutingEntry& e : world.routing) {
    if (e.ids.size(0) % ranks != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layer %d: a routing decision of %d tokens does not split into %d equal shards", e.layer, e.ids.size(0),
          ranks));
    }
  }
  // The sampler's draw at the step: the trainer state's generator.
  std::mt19937_64 rng;
  std::istringstream text(world.state.scalars.getString("rng").getValueOr("").str());
  if (!(text >> rng)) return absl::InvalidArgumentError("the trainer state's \"rng\" is not a std::mt19937_64 state");
  StepBundle b = world;
  MOERR_RETURN_IF_ERROR(CatchTorch("keeping the shards", [&]() -> absl::Status {
    const moe::AdditionTask::Batch batch = moe::AdditionTask().Sample(prompts, rng);
    // Rows of shard r of `t` for every kept r, in order.
    const auto shards = [&](const at::Tensor& t) {
      const int64_t n = t.size(0) / ranks;
      std::vector<at::Tensor> rows;
      for (int64_t r : kept) rows.push_back(t.narrow(0, r * n, n));
      return at::cat(rows, 0).contiguous();
    };
    for (RoutingEntry& e : b.routing) {
      e.ids = shards(e.ids);
      if (e.logits.defined()) e.logits = shards(e.logits);
      if (e.weights.defined()) e.weights = shards(e.weights);
    }
    if (b.responses.defined()) b.responses = shards(b.responses);
    b.prompts = shards(batch.prompts);
    b.answers = shards(batch.answers);
    return absl::OkStatus();
  }));
  b.options.prompts = prompts / ranks * static_cast<int64_t>(kept.size());
  return b;
}

absl::StatusOr<moe::MoeTransformer> LoadPolicy(const StepBundle& b) {
  MOERR_RETURN_IF_ERROR(Annotate(moe::Validate(b.config), "the step's model config"));
  moe::MoeTransformer policy{nullptr};
  MOERR_RETURN_IF_ERROR(CatchTorch("building the policy", [&]() -> absl::Status {
    policy = moe::MoeTransformer(b.config);
    std::map<std::string, formats::TensorView> weights;
    std::vector<at::Tensor> keep_alive;  // the views' storage
    for (const auto& [name, t] : b.state.tensors) {
      if (name.rfind("policy/", 0) != 0) continue;
      keep_alive.push_back(t.contiguous());
      MOERR_ASSIGN_OR_RETURN(weights[name.substr(sizeof("policy/") - 1)], recorder::ViewOf(keep_alive.back()));
    }
    return Annotate(moe::LoadWeights(policy, weights), "policy");
  }));
  return policy;
}

moe::TrainerState MapTrainerState(const moe::TrainerState& state, const TensorMap& map) {
  moe::TrainerState out;
  out.scalars = state.scalars;
  for (const auto& [name, t] : state.tensors) {
    if (auto mapped = map(name, t)) out.tensors.push_back(*std::move(mapped));
  }
  llvm::json::Object steps;
  if (const llvm::json::Object* old = state.scalars.getObject("adam_step")) {
    for (const auto& [name, n] : *old) {
      if (auto mapped = map(name.str(), at::Tensor())) steps[mapped->first] = n;
    }
  }
  out.scalars["adam_step"] = std::move(steps);
  return out;
}

namespace {

// The step's routing records, each with its ids, weights and logits.
absl::Status WriteRouting(formats::BundleWriter& writer, const StepBundle& b) {
  for (const RoutingEntry& e : b.routing) {
    formats::RoutingRecord r;
    r.layer = e.layer;
    r.micro_batch = e.micro_batch;
    const std::string prefix = absl::StrFormat("routing/L%d/mb%d/", e.layer, e.micro_batch);
    r.topk_ids = prefix + "topk_ids";
    r.topk_weights = prefix + "topk_weights";
    const int64_t experts = e.logits.defined() ? e.logits.size(1) : b.config.num_experts;
    const at::Tensor counts = at::bincount(e.ids.reshape({-1}), {}, experts);
    r.token_counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
    std::vector<std::pair<std::string, at::Tensor>> tensors = {
        {r.topk_ids, e.ids.to(at::kInt).contiguous()},
        {r.topk_weights, at::full(e.ids.sizes(), 1.0 / e.ids.size(1), at::kFloat)}};
    if (e.logits.defined()) {
      r.logits = prefix + "logits";
      tensors.emplace_back(r.logits, e.logits.contiguous());
      tensors[1].second = at::softmax(e.logits, -1).gather(1, e.ids).contiguous();
    }
    for (const auto& [name, t] : tensors) {
      absl::StatusOr<formats::TensorView> view = recorder::ViewOf(t);
      absl::Status put = view.ok() ? writer.PutTensor(name, formats::Role::kOther, b.step, *view) : view.status();
      MOERR_RETURN_IF_ERROR(Annotate(put, absl::StrFormat("layer %d routing, tensor %s", e.layer, name)));
    }
    formats::Record record;
    record.kind = static_cast<uint16_t>(formats::RecordKind::kRouting);
    record.step = b.step;
    record.routing = std::move(r);
    MOERR_RETURN_IF_ERROR(writer.AppendRecord(std::move(record)));
  }
  return absl::OkStatus();
}

// The batch tensors the step has: responses, and a proxy's prompts and answers.
absl::Status WriteBatch(formats::BundleWriter& writer, const StepBundle& b) {
  const std::pair<const char*, const at::Tensor*> batch[] = {{replayer::kResponsesTensor, &b.responses},
                                                              {replayer::kPromptsTensor, &b.prompts},
                                                              {replayer::kAnswersTensor, &b.answers}};
  for (const auto& [name, tensor] : batch) {
    if (!tensor->defined()) continue;
    const at::Tensor t = tensor->to(at::kLong).contiguous();
    MOERR_ASSIGN_OR_RETURN(const formats::TensorView view, recorder::ViewOf(t));
    MOERR_RETURN_IF_ERROR(writer.PutTensor(name, formats::Role::kOther, b.step, view));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteStepBundle(const StepBundle& b, const std::string& path, const llvm::json::Object& annotations) {
  return Annotate(CatchTorch("writing the step", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(auto writer,
                           formats::BundleWriter::Create(path, formats::WriterOptions().set_overwrite(true)));
    MOERR_RETURN_IF_ERROR(writer->BeginStep(b.step));
    MOERR_RETURN_IF_ERROR(replayer::WriteTrainer(*writer, b.config, b.options, b.step, b.state));
    MOERR_RETURN_IF_ERROR(WriteRouting(*writer, b));
    MOERR_RETURN_IF_ERROR(WriteBatch(*writer, b));
    if (!b.metrics.empty()) {
      MOERR_RETURN_IF_ERROR(writer->Annotate(formats::kMetricsAnnotation, llvm::json::Object(b.metrics), b.step));
    }
    for (const auto& [key, value] : annotations) MOERR_RETURN_IF_ERROR(writer->Annotate(key.str(), value));
    MOERR_RETURN_IF_ERROR(writer->EndStep(b.step));
    return writer->Close();
  }), path);
}

int64_t ParameterCount(const StepBundle& b) {
  int64_t n = 0;
  for (const auto& [name, t] : b.state.tensors) {
    if (name.rfind("policy/", 0) == 0 && name.find("e_score_correction_bias") == std::string::npos) n += t.numel();
  }
  return n;
}

}  // namespace moerr::proxy
