#include "proxy/step_bundle.h"

#include "absl/strings/str_format.h"
#include "formats/bundle_writer.h"
#include "formats/trace.h"
#include "recorder/tensor_adapter.h"
#include "replayer/model_replay.h"
#include "support/status.h"
#include "support/torch_boundary.h"

namespace moerr::proxy {

absl::StatusOr<StepBundle> LoadStepBundle(const formats::BundleReader& reader, int64_t step) {
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<moe::GrpoTrainer> trainer, replayer::LoadTrainer(reader, step));
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
  return LoadStepBundle(reader, step, *trainer, trace);
}

absl::StatusOr<StepBundle> LoadStepBundle(const formats::BundleReader& reader, int64_t step,
                                          const moe::GrpoTrainer& trainer, const formats::Trace& trace) {
  StepBundle b;
  b.step = step;
  b.config = trainer.policy()->config();
  b.options = trainer.options();
  b.state = trainer.SaveState();
  for (auto& [name, t] : b.state.tensors) t = t.detach().clone();
  for (const formats::RoutingRecord& r : trace.routing) {
    RoutingEntry e{r.layer, r.micro_batch, {}, {}};
    MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor ids, reader.ReadTensor(r.topk_ids, step));
    e.ids = recorder::ToTensor(ids.view()).to(at::kLong);
    if (!r.logits.empty()) {
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor logits, reader.ReadTensor(r.logits, step));
      e.logits = recorder::ToTensor(logits.view()).to(at::kFloat);
    }
    b.routing.push_back(std::move(e));
  }
  if (auto m = reader.ReadAnnotation("metrics", step); m.ok() && m->getAsObject()) b.metrics = *m->getAsObject();
  return b;
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

absl::Status WriteStepBundle(const StepBundle& b, const std::string& path, const llvm::json::Object& annotations) {
  return CatchTorch("writing " + path, [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(auto writer,
                           formats::BundleWriter::Create(path, formats::WriterOptions().set_overwrite(true)));
    MOERR_RETURN_IF_ERROR(writer->BeginStep(b.step));
    MOERR_RETURN_IF_ERROR(replayer::WriteTrainer(*writer, b.config, b.options, b.step, b.state));
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
        MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(t));
        MOERR_RETURN_IF_ERROR(writer->PutTensor(name, formats::Role::kOther, b.step, view));
      }
      formats::Record record;
      record.kind = static_cast<uint16_t>(formats::RecordKind::kRouting);
      record.step = b.step;
      record.routing = std::move(r);
      MOERR_RETURN_IF_ERROR(writer->AppendRecord(std::move(record)));
    }
    if (!b.metrics.empty()) MOERR_RETURN_IF_ERROR(writer->Annotate("metrics", llvm::json::Object(b.metrics), b.step));
    for (const auto& [key, value] : annotations) MOERR_RETURN_IF_ERROR(writer->Annotate(key.str(), value));
    MOERR_RETURN_IF_ERROR(writer->EndStep(b.step));
    return writer->Close();
  });
}

int64_t ParameterCount(const StepBundle& b) {
  int64_t n = 0;
  for (const auto& [name, t] : b.state.tensors) {
    if (name.rfind("policy/", 0) == 0 && name.find("e_score_correction_bias") == std::string::npos) n += t.numel();
  }
  return n;
}

}  // namespace moerr::proxy
