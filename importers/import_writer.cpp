#include "importers/import_writer.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/annotations.h"
#include "formats/bundle_index.h"
#include "formats/world_manifest.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/check.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "support/version.h"

namespace moerr::importers {
namespace {

// Ops per `ops` record, as the recorder batches them.
constexpr size_t kBatchOps = 1024;

}  // namespace

absl::StatusOr<std::unique_ptr<ImportWriter>> ImportWriter::Create(const std::string& path, bool overwrite, bool full,
                                                                   llvm::json::Object source) {
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<formats::BundleWriter> writer,
                         formats::BundleWriter::Create(path, formats::WriterOptions().set_overwrite(overwrite)));
  // Not replayable: the ops are a dump's API calls, not dispatcher ops.
  formats::Recording recording;
  recording.mode = full ? "full" : "stats";
  recording.trigger = "always";
  recording.imported = std::move(source);
  MOERR_RETURN_IF_ERROR(writer->Annotate(formats::kRecordingAnnotation, formats::ToJson(recording)));
  return std::unique_ptr<ImportWriter>(new ImportWriter(std::move(writer), full));
}

absl::Status ImportWriter::BeginStep(int64_t step) {
  MOERR_CHECK(step_ < 0) << "BeginStep inside step " << step_;
  step_ = step;
  ++stats_.steps;
  return writer_->BeginStep(step);
}

absl::StatusOr<uint64_t> ImportWriter::Add(formats::DType dtype, std::vector<int64_t> shape,
                                           const formats::Fingerprint& fp, const at::Tensor& bytes, bool output) {
  MOERR_CHECK(step_ >= 0) << "a tensor outside a step";
  const bool stored = full_ && bytes.defined();
  formats::TensorMeta meta;
  meta.id = next_id_++;
  meta.dtype = dtype;
  meta.shape = std::move(shape);
  meta.fingerprint = fp;
  // Contiguous row-major strides: what a dump's tensors are saved as.
  meta.strides.assign(meta.shape.size(), 1);
  for (size_t d = meta.shape.size(); d-- > 1;) meta.strides[d - 1] = meta.strides[d] * std::max<int64_t>(meta.shape[d], 1);
  if (stored) {
    meta.leaf = absl::StrCat(output ? "act/" : "in/", meta.id);
    MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(bytes));
    MOERR_RETURN_IF_ERROR(writer_->PutTensor(meta.leaf, output ? formats::Role::kActivation : formats::Role::kLeaf,
                                             step_, view));
    stats_.tensor_bytes += bytes.nbytes();
  }
  if (output) pending_outputs_.push_back(batch_.tensors.size());
  batch_.tensors.push_back(std::move(meta));
  ++stats_.tensors;
  return batch_.tensors.back().id;
}

absl::StatusOr<uint64_t> ImportWriter::Input(formats::DType dtype, std::vector<int64_t> shape,
                                             const formats::Fingerprint& fp, const at::Tensor& bytes) {
  return Add(dtype, std::move(shape), fp, bytes, false);
}

absl::StatusOr<uint64_t> ImportWriter::Output(formats::DType dtype, std::vector<int64_t> shape,
                                              const formats::Fingerprint& fp, const at::Tensor& bytes) {
  return Add(dtype, std::move(shape), fp, bytes, true);
}

absl::Status ImportWriter::AddOp(formats::OpEvent op) {
  op.seq = next_seq_++;
  op.thread = 0;
  for (size_t i : pending_outputs_) batch_.tensors[i].producer = static_cast<int64_t>(op.seq);
  pending_outputs_.clear();
  batch_.ops.push_back(std::move(op));
  ++stats_.ops;
  return batch_.ops.size() >= kBatchOps ? Flush() : absl::OkStatus();
}

absl::Status ImportWriter::Flush() {
  if (batch_.ops.empty() && batch_.tensors.empty()) return absl::OkStatus();
  formats::Record record;
  record.kind = static_cast<uint16_t>(formats::RecordKind::kOps);
  record.step = step_;
  record.ops = std::move(batch_);
  batch_ = {};
  return writer_->AppendRecord(record);
}

absl::Status ImportWriter::Annotate(const std::string& key, llvm::json::Value value) {
  return writer_->Annotate(key, std::move(value), step_);
}

absl::Status ImportWriter::EndStep(llvm::json::Object step_note) {
  MOERR_CHECK(pending_outputs_.empty()) << "outputs without their op";
  MOERR_RETURN_IF_ERROR(Flush());
  MOERR_RETURN_IF_ERROR(Annotate(formats::kImportedStepAnnotation, std::move(step_note)));
  const int64_t step = step_;
  step_ = -1;
  return writer_->EndStep(step);
}

absl::Status ImportWriter::Close() { return writer_->Close(); }

absl::Status PrepareRunDirectory(const std::string& run_dir, bool overwrite) {
  MOERR_RETURN_IF_ERROR(MakeDirectory(run_dir));
  if (!overwrite || !formats::IsRunDirectory(run_dir)) return absl::OkStatus();
  namespace fs = std::filesystem;
  if (auto old = formats::ReadWorldManifest(run_dir); old.ok()) {
    std::error_code ec;
    for (const formats::WorldRank& r : old->ranks) {
      // Only a bundle inside the run directory, whatever the manifest says.
      if (r.bundle.find('/') == std::string::npos && absl::EndsWith(r.bundle, ".moerr")) {
        fs::remove(fs::path(run_dir) / r.bundle, ec);
      }
    }
  }
  std::error_code ec;
  fs::remove(fs::path(run_dir) / formats::kWorldManifestName, ec);
  return absl::OkStatus();
}

void ImportWriter::Abandon() {
  if (writer_ == nullptr) return;
  const std::string partial = writer_->partial_path();
  writer_.reset();  // waits for its pending chunks
  std::error_code ec;
  std::filesystem::remove(partial, ec);
}

}  // namespace moerr::importers
