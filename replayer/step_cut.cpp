#include "replayer/step_cut.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/bundle_writer.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/program_replay.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

using formats::OpArg;

// Ops per `ops` record, as the recorder batches them; each record carries the
// metadata of the tensors its ops name first.
constexpr size_t kBatchOps = 256;

// Appends `cut`'s ops to `writer` as `ops` records of step `step`.
absl::Status AppendOps(formats::BundleWriter& writer, int64_t step, const formats::Trace& cut) {
  absl::flat_hash_set<uint64_t> named;
  for (size_t begin = 0; begin < cut.ops.size(); begin += kBatchOps) {
    formats::Record record;
    record.kind = static_cast<uint16_t>(formats::RecordKind::kOps);
    record.step = step;
    const size_t end = std::min(cut.ops.size(), begin + kBatchOps);
    for (size_t i = begin; i < end; ++i) {
      const formats::OpEvent& op = cut.ops[i];
      std::vector<uint64_t> ids = formats::TensorsRead(op);
      ids.insert(ids.end(), op.outputs.begin(), op.outputs.end());
      for (uint64_t id : ids) {
        const formats::TensorMeta* meta = cut.Find(id);
        if (id != 0 && meta != nullptr && named.insert(id).second) record.ops.tensors.push_back(*meta);
      }
      record.ops.ops.push_back(op);
    }
    MOERR_RETURN_IF_ERROR(writer.AppendRecord(record));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CutLeafName(const formats::TensorMeta& meta) {
  if (!meta.leaf.empty() && !absl::StartsWith(meta.leaf, "act/")) return meta.leaf;
  return absl::StrCat("v/", meta.id);
}

formats::Trace CutStep(const formats::Trace& step, const std::vector<size_t>& kept) {
  formats::Trace out;
  absl::flat_hash_set<uint64_t> seen, produced;
  for (size_t index : kept) {
    const formats::OpEvent& op = step.ops[index];
    for (uint64_t id : formats::TensorsRead(op)) {
      const formats::TensorMeta* meta = step.Find(id);
      if (meta == nullptr || !seen.insert(id).second || produced.contains(id)) continue;
      formats::TensorMeta leaf = *meta;  // cut free: a value of its own
      leaf.leaf = CutLeafName(*meta);
      leaf.producer = -1;
      leaf.view_of = 0;
      leaf.storage_offset = 0;
      out.tensors.push_back(std::move(leaf));
    }
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* meta = step.Find(id);
      if (id == 0 || meta == nullptr) continue;
      produced.insert(id);
      if (!seen.insert(id).second) continue;
      formats::TensorMeta made = *meta;
      // Random and foreign ops' outputs stay leaves (the replay takes them
      // from the record); an activation is made by the replay.
      made.leaf = made.leaf.empty() || absl::StartsWith(made.leaf, "act/") ? "" : CutLeafName(*meta);
      out.tensors.push_back(std::move(made));
    }
    out.ops.push_back(op);
  }
  out.Index();
  return out;
}

absl::Status WriteCutBundle(const std::string& path, int64_t step, const formats::Trace& cut, bool with_ops,
                            const std::map<uint64_t, at::Tensor>& values, const formats::BundleReader& source,
                            const formats::Recording& recording, bool compress) {
  MOERR_ASSIGN_OR_RETURN(
      std::unique_ptr<formats::BundleWriter> writer,
      formats::BundleWriter::Create(path, formats::WriterOptions().set_overwrite(true).set_compress(compress).set_sync(compress)));
  MOERR_RETURN_IF_ERROR(writer->Annotate(formats::kRecordingAnnotation, formats::ToJson(recording)));
  MOERR_RETURN_IF_ERROR(writer->BeginStep(step));
  for (const formats::TensorMeta& meta : cut.tensors) {
    auto value = values.find(meta.id);
    if (meta.leaf.empty() || value == values.end()) continue;
    const formats::TensorInfo* original = source.FindTensor(meta.leaf, step);
    if (original == nullptr) original = source.FindTensor(meta.leaf);
    MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(value->second));
    MOERR_RETURN_IF_ERROR(Annotate(
        writer->PutTensor(meta.leaf, original != nullptr ? original->role : formats::Role::kActivation, step, view),
        absl::StrCat(path, ", tensor ", meta.leaf)));
  }
  if (with_ops) MOERR_RETURN_IF_ERROR(AppendOps(*writer, step, cut));
  MOERR_RETURN_IF_ERROR(writer->EndStep(step));
  return writer->Close();
}

absl::Status NeedsRecordedOutputs(const formats::StepTrace& s, absl::string_view why) {
  const std::optional<formats::Recording> recording = formats::RecordingOf(*s.reader);
  const std::string mode = recording ? recording->mode : "";
  if (mode == "stats") {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s was recorded in stats mode: it holds fingerprints, not values, and %s (record with mode \"full\")",
        s.path, why));
  }
  if (!formats::HoldsOpOutputs(*s.reader, s.trace)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s, step %d holds no op's outputs (mode %s): %s (record with mode \"full\")", s.path,
                        s.step, mode.empty() ? "unknown" : mode, why));
  }
  return absl::OkStatus();
}

absl::StatusOr<OneOpCut> CutOneOp(const formats::StepTrace& s, size_t index, const OpReferences* references) {
  OneOpCut out{CutStep(s.trace, {index}), {}};
  std::set<uint64_t> inputs;
  for (const formats::TensorMeta& meta : out.cut.tensors) {
    if (meta.producer < 0) inputs.insert(meta.id);
  }
  ReplayOptions isolated;
  isolated.isolated = true;
  isolated.end_op = index + 1;
  isolated.capture = &inputs;
  isolated.references = references;
  const std::string where = absl::StrFormat("%s, step %d", s.path, s.step);
  absl::StatusOr<ReplayReport> replayed = ReplayTrace(*s.reader, s.step, s.trace, isolated);
  if (!replayed.ok()) return Annotate(replayed.status(), where);
  for (uint64_t id : inputs) {
    auto value = replayed->captured.find(id);
    if (value == replayed->captured.end()) {
      return absl::DataLossError(
          absl::StrFormat("%s: tensor %d, an input of op %d, was not read by its replay", where, id, index));
    }
    out.values[id] = value->second;
  }
  for (formats::TensorMeta& meta : out.cut.tensors) {
    const formats::TensorMeta* recorded = meta.producer >= 0 ? s.trace.Find(meta.id) : nullptr;
    if (recorded == nullptr || recorded->leaf.empty()) continue;
    absl::StatusOr<formats::OwnedTensor> owned = s.reader->ReadTensor(recorded->leaf, s.step);
    if (!owned.ok()) return Annotate(owned.status(), where);
    meta.leaf = recorded->leaf;
    out.values[meta.id] = recorder::ToTensor(owned->view());
  }
  out.cut.Index();
  return out;
}

}  // namespace moerr::replayer
