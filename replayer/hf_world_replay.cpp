#include "replayer/hf_world_replay.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/annotations.h"
#include "formats/hf_checkpoint.h"
#include "formats/json_number.h"
#include "formats/module_path.h"
#include "moe/checkpoint.h"
#include "moe/moe_transformer.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

constexpr char kParam[] = "param/";
constexpr char kGrad[] = "grad/";
constexpr char kOut[] = "out/";
constexpr char kInputIds[] = "batch/input_ids";
constexpr char kObjective[] = "causal-lm-cross-entropy";

const formats::TensorView* Find(const formats::SafetensorsFile& f, const std::string& name) {
  for (const auto& [n, v] : f.tensors) {
    if (n == name) return &v;
  }
  return nullptr;
}

bool IsExpertParameter(absl::string_view name) { return formats::ExpertOf(name).has_value(); }

// The rank's batch as the replay and the proxy's calibration run it:
// [B, S >= 2] integer ids within the config's vocabulary.
absl::Status CheckBatch(const std::string& path, const formats::SafetensorsFile& f, int64_t vocab) {
  const formats::TensorView* v = Find(f, kInputIds);
  if ((v->dtype != formats::DType::kI64 && v->dtype != formats::DType::kI32) || v->shape.size() != 2 ||
      v->shape[1] < 2) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s is %s [%s]; the replay needs [B, S >= 2] int64", path,
                                                      kInputIds, formats::DTypeName(v->dtype),
                                                      absl::StrJoin(v->shape, ", ")));
  }
  return CatchTorch(path, [&]() -> absl::Status {
    const at::Tensor ids = recorder::ToTensor(*v);
    if (ids.numel() == 0) return absl::InvalidArgumentError(absl::StrFormat("%s: %s is empty", path, kInputIds));
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s holds token id %d, outside the hf_config's vocabulary "
                                                        "[0, %d)",
                                                        path, kInputIds, lo < 0 ? lo : hi, vocab));
    }
    return absl::OkStatus();
  });
}

// The "hf_model" annotation of a rank that has none: why its capture was
// not written (moerr.record's "hf_model_unwritten"), or that model= was not passed.
absl::Status NoCapture(const formats::WorldStep& world, int64_t rank) {
  const std::string why = WhyNoCapture(world.ranks.at(static_cast<size_t>(rank)));
  if (!why.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s, rank %d: moerr.record(model=) wrote no capture: %s", world.dir, rank, why));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s, rank %d: no \"%s\" annotation (rank 0 has one): every rank must pass model= and hf_config= to "
      "moerr.record",
      world.dir, rank, formats::kHfModelAnnotation));
}

// Rank 0's config, the model built from it; another rank's must be the same.
absl::Status ReadConfig(const formats::WorldStep& world, int64_t rank, const formats::HfModel& capture,
                        HfWorldRecord& record) {
  const llvm::json::Object* config = capture.config ? &*capture.config : nullptr;
  if (config == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s, rank %d: the hf_model annotation has no config", world.dir,
                                                      rank));
  }
  if (rank > 0) {
    if (*config == record.hf_config) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s, rank %d: its hf_config is not rank 0's (every rank must pass the same config to moerr.record)",
        world.dir, rank));
  }
  record.hf_config = *config;
  absl::StatusOr<moe::MoeConfig> c = moe::FromHfConfig(*config);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrFormat("%s: the hf_config passed to moerr.record: %s", world.dir,
                                                           c.status().message()));
  }
  record.config = *c;
  return absl::OkStatus();
}

// The first sign in a rank's capture that the loop did not run in fp32: a
// parameter stored in another dtype, or logits computed in one.
void NoteLoopPrecision(const formats::SafetensorsFile& f, const std::optional<std::string>& logits_dtype,
                       HfWorldRecord& record) {
  if (!record.loop_precision.empty()) return;
  for (const auto& [name, view] : f.tensors) {
    if (absl::StartsWith(name, kParam) && view.dtype != formats::DType::kF32) {
      record.loop_precision = absl::StrFormat("%s parameters", formats::DTypeName(view.dtype));
      return;
    }
  }
  if (logits_dtype && *logits_dtype != "float32") record.loop_precision = *logits_dtype + " logits";
}

// Rank `rank`'s capture: its annotation and file, checked against rank 0's
// step and config.
absl::Status ReadRank(const formats::WorldStep& world, int64_t rank, HfWorldRecord& record) {
  const formats::RankStep& r = world.ranks.at(static_cast<size_t>(rank));
  if (!r.reader) return absl::Status(r.error.code(), absl::StrFormat("%s, rank %d: %s", world.dir, rank, r.error.message()));
  absl::StatusOr<formats::HfModel> capture =
      formats::ReadHfModel(*r.reader, absl::StrFormat("%s, rank %d", world.dir, rank));
  if (absl::IsNotFound(capture.status())) return NoCapture(world, rank);
  if (!capture.ok()) return capture.status();
  if (capture->file.find("..") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrFormat("%s, rank %d: the \"%s\" annotation names a file outside the run",
                                                      world.dir, rank, formats::kHfModelAnnotation));
  }
  if (capture->objective != kObjective) {
    return absl::InvalidArgumentError(absl::StrFormat("%s, rank %d: objective \"%s\": the replay knows \"%s\" only",
                                                      world.dir, rank, capture->objective, kObjective));
  }
  if (rank == 0) record.step = capture->step;
  if (capture->step != record.step) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: rank %d captured step %d, rank 0 step %d", world.dir, rank,
                                                      capture->step, record.step));
  }
  MOERR_RETURN_IF_ERROR(ReadConfig(world, rank, *capture, record));
  const std::string path = world.dir + "/" + capture->file;
  MOERR_ASSIGN_OR_RETURN(formats::SafetensorsFile f, formats::ReadSafetensors(path));
  for (const std::string need : {kInputIds, "out/loss", "out/logits"}) {
    if (Find(f, need) == nullptr) return absl::InvalidArgumentError(absl::StrFormat("%s: no \"%s\"", path, need));
  }
  MOERR_RETURN_IF_ERROR(CheckBatch(path, f, record.config.vocab_size));
  NoteLoopPrecision(f, capture->logits_dtype, record);
  record.ranks.push_back(std::move(f));
  return absl::OkStatus();
}

at::Tensor ReadNamed(const formats::SafetensorsFile& f, const std::string& name) {
  const formats::TensorView* v = Find(f, name);
  return v == nullptr ? at::Tensor() : recorder::ToTensor(*v);
}

// The union of the ranks' parameters, each from the lowest rank holding it.
std::map<std::string, formats::TensorView> UnionOfParameters(const HfWorldRecord& record) {
  std::map<std::string, formats::TensorView> weights;
  for (const formats::SafetensorsFile& f : record.ranks) {
    for (const auto& [name, view] : f.tensors) {
      if (absl::StartsWith(name, kParam)) weights.emplace(name.substr(sizeof(kParam) - 1), view);
    }
  }
  return weights;
}

// Every parameter's copy on a later rank against the lowest rank's: same
// shape (an error), same bytes (else listed in `record.diverged`).
absl::Status CheckReplicas(HfWorldRecord& record) {
  std::map<std::string, std::pair<int64_t, const formats::TensorView*>> first;
  for (size_t r = 0; r < record.ranks.size(); ++r) {
    for (const auto& [name, view] : record.ranks[r].tensors) {
      if (!absl::StartsWith(name, kParam)) continue;
      const auto [it, inserted] = first.emplace(name, std::make_pair(static_cast<int64_t>(r), &view));
      if (inserted) continue;
      const formats::TensorView& a = *it->second.second;
      if (a.shape != view.shape || a.dtype != view.dtype) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: %s is %s [%s] on rank %d, %s [%s] on rank %d", record.dir, name, formats::DTypeName(a.dtype),
            absl::StrJoin(a.shape, ", "), it->second.first, formats::DTypeName(view.dtype),
            absl::StrJoin(view.shape, ", "), r));
      }
      const absl::StatusOr<int64_t> n = formats::CheckedNumel(view.shape, formats::ItemSize(view.dtype));  // bytes
      const size_t bytes = n.ok() ? static_cast<size_t>(*n) : 0;
      if (a.IsContiguous() && view.IsContiguous() && std::memcmp(a.data, view.data, bytes) != 0) {
        record.diverged.push_back(absl::StrFormat("%s (rank %d)", name.substr(sizeof(kParam) - 1), r));
      }
    }
  }
  return absl::OkStatus();
}

// Original rank `f`'s own copies of the dense parameters it holds, into `model`.
void LoadDenseCopies(moe::MoeTransformer& model, const formats::SafetensorsFile& f) {
  at::NoGradGuard no_grad;
  auto params = model->named_parameters();
  for (const auto& [name, view] : f.tensors) {
    if (!absl::StartsWith(name, kParam)) continue;
    const std::string p = name.substr(sizeof(kParam) - 1);
    at::Tensor* t = IsExpertParameter(p) ? nullptr : params.find(p);
    if (t != nullptr) t->copy_(recorder::ToTensor(view));
  }
}

// The model from the config and the union of the ranks' parameters;
// LoadWeights names a missing or extra one.
absl::StatusOr<moe::MoeTransformer> BuildModel(const HfWorldRecord& record) {
  const std::map<std::string, formats::TensorView> weights = UnionOfParameters(record);
  moe::MoeTransformer model(record.config);
  const absl::Status s = moe::LoadWeights(model, weights);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("%s: the union of the ranks' parameters (hf/rank<K>.safetensors) "
                                                  "is not the model hf_config describes: %s",
                                                  record.dir, s.message()));
  }
  return model;
}

// Serves the recorded decisions of the pass's original rank, in place of
// the router's own, counting agreement; a decision not recorded (or of
// another shape) is routed live and counted.
class PassRouting : public recorder::RoutingSource {
 public:
  void Serve(const RoutingQueues* queues) {
    queues_ = queues;
    next_.clear();
  }
  at::Tensor Route(int64_t layer, const at::Tensor& live, int64_t num_experts) override {
    at::DisableRecordFunctionGuard no_record;
    const auto it = queues_ == nullptr ? RoutingQueues::const_iterator() : queues_->find(layer);
    size_t& next = next_[layer];
    if (queues_ == nullptr || it == queues_->end() || next >= it->second.size() ||
        it->second[next].sizes() != live.sizes()) {
      ++live_;
      return live;
    }
    const at::Tensor ids = it->second[next++];
    if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= num_experts)) {
      ++live_;
      return live;
    }
    slots_ += live.numel();
    alike_ += live.unsqueeze(2).eq(ids.unsqueeze(1)).any(2).sum().item<int64_t>();
    return ids;
  }
  at::Tensor Counts() const { return at::tensor(std::vector<int64_t>{slots_, alike_, live_}, at::kLong); }

 private:
  const RoutingQueues* queues_ = nullptr;
  std::map<int64_t, size_t> next_;
  int64_t slots_ = 0, alike_ = 0, live_ = 0;
};

void Put(std::vector<std::pair<std::string, at::Tensor>>& out, std::string name, const at::Tensor& t) {
  out.emplace_back(std::move(name), t.detach().to(t.is_floating_point() ? at::kFloat : at::kLong).contiguous().clone());
}

// One original rank's pass: forward and backward of its objective. Dense
// gradients are cleared first; experts' accumulate.
void Pass(moe::MoeTransformer& model, const at::Tensor& ids, int64_t rank,
          std::vector<std::pair<std::string, at::Tensor>>& out) {
  for (auto& p : model->named_parameters()) {
    if (!IsExpertParameter(p.key())) p.value().mutable_grad() = at::Tensor();
  }
  moe::ForwardOutput f = model->Forward(ids, /*keep_hidden=*/true);
  const int64_t s = ids.size(1), vocab = f.logits.size(-1);
  const at::Tensor loss = at::cross_entropy_loss(f.logits.narrow(1, 0, s - 1).reshape({-1, vocab}),
                                                 ids.narrow(1, 1, s - 1).reshape({-1}));
  loss.backward();
  const std::string prefix = absl::StrFormat("rank%d/", rank);
  for (size_t l = 0; l < f.hidden.size(); ++l) Put(out, prefix + kOut + "model.layers." + std::to_string(l), f.hidden[l]);
  Put(out, prefix + kOut + "logits", f.logits);
  Put(out, prefix + kOut + "loss", loss);
  for (const auto& p : model->named_parameters()) {
    if (!IsExpertParameter(p.key()) && p.value().grad().defined()) Put(out, prefix + kGrad + p.key(), p.value().grad());
  }
}

}  // namespace

std::string WhyNoCapture(const formats::RankStep& rank) {
  if (!rank.reader) return "";
  absl::StatusOr<llvm::json::Value> a = rank.reader->ReadAnnotation(formats::kHfModelUnwrittenAnnotation);
  if (!a.ok()) return "";
  const auto why = a->getAsString();
  return why ? why->str() : "";
}

bool HasHfModel(const formats::WorldStep& world) {
  return !world.ranks.empty() && world.ranks[0].reader &&
         world.ranks[0].reader->ReadAnnotation(formats::kHfModelAnnotation).ok();
}

absl::StatusOr<HfWorldRecord> ReadHfWorld(formats::WorldStep& world) {
  HfWorldRecord record;
  record.dir = world.dir;
  for (int64_t r = 0; r < static_cast<int64_t>(world.ranks.size()); ++r) MOERR_RETURN_IF_ERROR(ReadRank(world, r, record));
  MOERR_RETURN_IF_ERROR(CheckReplicas(record));
  MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, record.step));
  for (const formats::RankStep& r : world.ranks) {
    if (!r.reader || !r.trace) {
      return absl::FailedPreconditionError(absl::StrFormat("%s, rank %d: step %d: %s", world.dir, r.rank, record.step,
                                                           r.error.ok() ? "not recorded" : r.error.message()));
    }
    MOERR_ASSIGN_OR_RETURN(RoutingQueues q, ReadRouting(*r.reader, *r.trace, record.step));
    record.routing.push_back(std::move(q));
  }
  return record;
}

absl::Status WriteHfCheckpoint(const HfWorldRecord& record, const std::string& dir) {
  MOERR_RETURN_IF_ERROR(BuildModel(record).status());  // the union is the model's: no tensor missing or extra
  const std::map<std::string, formats::TensorView> weights = UnionOfParameters(record);
  return formats::SaveHfCheckpoint(dir, record.hf_config, {weights.begin(), weights.end()}, /*overwrite=*/true);
}

absl::StatusOr<int64_t> WriteHfBatch(const HfWorldRecord& record, const std::string& path) {
  for (size_t r = 1; r < record.ranks.size(); ++r) {
    const std::vector<int64_t>& first = Find(record.ranks[0], kInputIds)->shape;
    const std::vector<int64_t>& other = Find(record.ranks[r], kInputIds)->shape;
    if (other[1] != first[1]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: rank 0's batch is [%s], rank %d's [%s]: the calibration batch is one [B, S]; pass --tokens FILE",
          record.dir, absl::StrJoin(first, ", "), r, absl::StrJoin(other, ", ")));
    }
  }
  at::Tensor ids;
  MOERR_RETURN_IF_ERROR(CatchTorch("the recorded batches", [&]() -> absl::Status {
    std::vector<at::Tensor> rows;
    for (const formats::SafetensorsFile& f : record.ranks) rows.push_back(ReadNamed(f, kInputIds).to(at::kLong));
    ids = at::cat(rows, 0).contiguous();
    return absl::OkStatus();
  }));
  MOERR_ASSIGN_OR_RETURN(formats::TensorView v, recorder::ViewOf(ids));
  MOERR_RETURN_IF_ERROR(formats::WriteSafetensors(path, {{"input_ids", std::move(v)}}, {}, /*overwrite=*/true));
  return ids.numel();
}

absl::StatusOr<WorldReplayPlan> PlanHfReplay(const formats::WorldManifest& manifest, const moe::MoeConfig& config,
                                             int64_t ranks) {
  formats::WorldManifest m = manifest;
  if (m.experts <= 0) m.experts = config.num_experts;
  if (m.experts != config.num_experts) {
    return absl::InvalidArgumentError(absl::StrFormat("world.json has %d experts per layer, the hf_config %d",
                                                      m.experts, config.num_experts));
  }
  return PlanWorldReplay(m, ranks);
}

absl::Status ReplayHfRank(const HfWorldRecord& record, const WorldReplayPlan& plan, int64_t rank,
                          moe::Parallel* parallel, const std::string& out_file) {
  MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer model, BuildModel(record));
  std::vector<std::pair<std::string, at::Tensor>> out;
  PassRouting routing;
  MOERR_RETURN_IF_ERROR(CatchTorch("the replay's forward and backward", [&]() -> absl::Status {
    if (parallel != nullptr) model->SetParallel(parallel);
    model->SetRoutingSource(&routing);
    for (int64_t r = rank * plan.covers(); r < (rank + 1) * plan.covers(); ++r) {
      routing.Serve(&record.routing.at(static_cast<size_t>(r)));
      const at::Tensor ids = ReadNamed(record.ranks.at(static_cast<size_t>(r)), kInputIds).to(at::kLong);
      if (ids.dim() != 2 || ids.size(1) < 2) {
        return absl::InvalidArgumentError(absl::StrFormat("%s, rank %d: batch/input_ids must be [B, S >= 2]", record.dir, r));
      }
      LoadDenseCopies(model, record.ranks.at(static_cast<size_t>(r)));
      Pass(model, ids, r, out);
    }
    const moe::ParallelLayout layout = parallel != nullptr ? parallel->layout() : moe::ParallelLayout{};
    const int64_t first = layout.first_local_expert(record.config.num_experts);
    const int64_t count = layout.local_experts(record.config.num_experts);
    for (const auto& p : model->named_parameters()) {
      const auto e = formats::ExpertOf(p.key());
      if (e && e->second >= first && e->second < first + count && p.value().grad().defined()) {
        Put(out, kGrad + p.key(), p.value().grad());
      }
    }
    Put(out, "routing", routing.Counts());
    return absl::OkStatus();
  }));
  model->SetRoutingSource(nullptr);
  std::vector<std::pair<std::string, formats::TensorView>> views;
  for (const auto& [name, t] : out) {
    MOERR_ASSIGN_OR_RETURN(formats::TensorView v, recorder::ViewOf(t));
    views.emplace_back(name, std::move(v));
  }
  return formats::WriteSafetensors(out_file, views, {}, /*overwrite=*/true);
}

double HfDeviation::relative() const { return max_abs / std::max(scale, kHfFloor); }

const HfDeviation* HfReplayComparison::Worst(const std::string& kind) const {
  const HfDeviation* worst = nullptr;
  for (const HfDeviation& d : rows) {
    if (d.kind == kind && (worst == nullptr || d.relative() > worst->relative())) worst = &d;
  }
  return worst;
}

bool HfReplayComparison::ok() const {
  return std::all_of(rows.begin(), rows.end(), [&](const HfDeviation& d) { return d.relative() <= tolerance; });
}

namespace {

HfDeviation Deviation(std::string kind, std::string name, int64_t rank, const at::Tensor& replay,
                      const at::Tensor& recorded) {
  HfDeviation d{std::move(kind), std::move(name), rank};
  const at::Tensor b = recorded.to(at::kDouble), a = replay.to(at::kDouble);
  if (b.numel() == 0) return d;
  // A non-finite element agrees with the same value only (a NaN step
  // reproduced is no deviation); against anything else it deviates by inf.
  const at::Tensor same = (a.isnan() & b.isnan()) | (a == b);
  const at::Tensor diff = (a - b).abs().nan_to_num(/*nan=*/INFINITY).masked_fill(same, 0.0);
  const at::Tensor finite = b.isfinite();
  d.scale = finite.any().item<bool>() ? b.masked_select(finite).abs().max().item<double>() : 0.0;
  d.max_abs = diff.max().item<double>();
  d.nonfinite = b.numel() - finite.sum().item<int64_t>();
  return d;
}

// Sums `name` over `files` (an expert's gradient over its replicas); undefined when none holds it.
at::Tensor Sum(const std::vector<formats::SafetensorsFile>& files, const std::string& name) {
  at::Tensor sum;
  for (const formats::SafetensorsFile& f : files) {
    const at::Tensor t = ReadNamed(f, name);
    if (t.defined()) sum = sum.defined() ? sum + t.to(at::kDouble) : t.to(at::kDouble);
  }
  return sum;
}

// Original rank `rank`'s outputs and dense gradients against the replay's.
absl::Status CompareRank(const HfWorldRecord& record, int64_t rank, const formats::SafetensorsFile& replay,
                         const std::string& replay_path, HfReplayComparison& c) {
  const std::string prefix = absl::StrFormat("rank%d/", rank);
  for (const auto& [name, view] : record.ranks.at(static_cast<size_t>(rank)).tensors) {
    const bool out = absl::StartsWith(name, kOut), grad = absl::StartsWith(name, kGrad);
    if (!out && !(grad && !IsExpertParameter(name.substr(sizeof(kGrad) - 1)))) continue;
    at::Tensor got = ReadNamed(replay, prefix + name);
    const at::Tensor want = recorder::ToTensor(view);
    if (!got.defined() && grad) got = at::zeros_like(want, at::kFloat);  // the replay's backward did not reach it
    if (!got.defined() || got.sizes() != want.sizes()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s, rank %d: \"%s\" has no counterpart of its shape in the replay (%s): the model's module names must be "
          "HF's (model.layers.<i>)",
          record.dir, rank, name, replay_path));
    }
    const std::string what = name.substr(name.find('/') + 1);
    c.rows.push_back(Deviation(out ? (what == "loss" ? "loss" : "output") : "dense gradient", what, rank, got, want));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfReplayComparison> CompareHfReplay(const HfWorldRecord& record, const std::string& out_dir,
                                                   const WorldReplayPlan& plan) {
  HfReplayComparison c;
  c.run = record.dir;
  c.step = record.step;
  c.original_ranks = plan.original_ranks;
  c.ranks = plan.ranks;
  c.diverged = record.diverged;
  c.loop_precision = record.loop_precision;
  std::vector<formats::SafetensorsFile> replay;
  for (int64_t m = 0; m < plan.ranks; ++m) {
    MOERR_ASSIGN_OR_RETURN(formats::SafetensorsFile f,
                           formats::ReadSafetensors(absl::StrFormat("%s/rank%d.safetensors", out_dir, m)));
    replay.push_back(std::move(f));
  }
  MOERR_RETURN_IF_ERROR(CatchTorch("comparing the replay", [&]() -> absl::Status {
    for (const formats::SafetensorsFile& f : replay) {
      const at::Tensor counts = ReadNamed(f, "routing");
      if (!counts.defined() || counts.numel() != 3) return absl::InvalidArgumentError(out_dir + ": a replay rank wrote no routing counts");
      c.routed_slots += counts[0].item<int64_t>();
      c.routed_alike += counts[1].item<int64_t>();
      c.routed_live += counts[2].item<int64_t>();
    }
    for (int64_t r = 0; r < plan.original_ranks; ++r) {
      const int64_t m = r / plan.covers();
      MOERR_RETURN_IF_ERROR(CompareRank(record, r, replay[static_cast<size_t>(m)],
                                        absl::StrFormat("%s/rank%d.safetensors", out_dir, m), c));
    }
    std::map<std::string, bool> experts;  // every expert parameter either side has a gradient of
    const std::vector<formats::SafetensorsFile>* sides[] = {&record.ranks, &replay};
    for (const auto* files : sides) {
      for (const formats::SafetensorsFile& f : *files) {
        for (const auto& [name, v] : f.tensors) {
          if (absl::StartsWith(name, kGrad) && IsExpertParameter(name.substr(sizeof(kGrad) - 1))) experts[name] = true;
        }
      }
    }
    for (const auto& [name, unused] : experts) {
      at::Tensor want = Sum(record.ranks, name), got = Sum(replay, name);
      if (!want.defined()) want = at::zeros_like(got);
      if (!got.defined()) got = at::zeros_like(want);
      c.rows.push_back(Deviation("expert gradient", name.substr(sizeof(kGrad) - 1), -1, got, want));
    }
    return absl::OkStatus();
  }));
  return c;
}

llvm::json::Object HfReplayJson(const HfReplayComparison& c) {
  llvm::json::Array rows;
  for (const HfDeviation& d : c.rows) {
    rows.push_back(llvm::json::Object{{"kind", d.kind},
                                      {"name", d.name},
                                      {"rank", d.rank >= 0 ? llvm::json::Value(d.rank) : nullptr},
                                      {"max_abs", formats::JsonNumber(d.max_abs)},
                                      {"scale", d.scale},
                                      {"relative", formats::JsonNumber(d.relative())},
                                      {"nonfinite", d.nonfinite}});
  }
  return llvm::json::Object{{"run", c.run},       {"step", c.step},           {"original_ranks", c.original_ranks},
                            {"ranks", c.ranks},   {"tolerance", c.tolerance}, {"ok", c.ok()},
                            {"routing", llvm::json::Object{{"served_slots", c.routed_slots},
                                                           {"router_agrees", c.routed_alike},
                                                           {"decisions_routed_live", c.routed_live}}},
                            {"diverged_parameters", llvm::json::Array(c.diverged)},
                            {"loop_precision", c.loop_precision.empty() ? llvm::json::Value("fp32")
                                                                        : llvm::json::Value(c.loop_precision)},
                            {"compared", std::move(rows)}};
}

}  // namespace moerr::replayer
