// Writes an imported step as a bundle the way the recorder does
// (recorder/recorder.cpp): a "recording" annotation, then per step its ops
// as `ops` records (OpBatch: events and the metadata of the tensors they
// first name), and in full bundles each tensor's bytes, op outputs as
// "act/<id>" (role activation) and other inputs as "in/<id>" (role leaf), so
// diff compares bytes and bisect reads fingerprints exactly as for a
// recording.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "formats/bundle_writer.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"

namespace moerr::importers {

struct ImportStats {
  uint64_t steps = 0, ops = 0, tensors = 0;  // tensors: metadata written (values, not files)
  uint64_t tensor_bytes = 0;                 // bytes of the tensors stored (full bundles)
};

class ImportWriter {
 public:
  // `mode`: "stats" (fingerprints only) or "full" (every tensor's bytes).
  // `source` describes what was imported (the "recording" annotation's
  // "imported" member).
  static absl::StatusOr<std::unique_ptr<ImportWriter>> Create(const std::string& path, bool overwrite, bool full,
                                                              llvm::json::Object source);

  absl::Status BeginStep(int64_t step);
  // A tensor an op reads that no earlier value of the step is (the caller
  // links those: importers/dataflow_index.h).
  absl::StatusOr<uint64_t> Input(formats::DType dtype, std::vector<int64_t> shape, const formats::Fingerprint& fp,
                                 const at::Tensor& bytes);
  // A tensor the next op added produces.
  absl::StatusOr<uint64_t> Output(formats::DType dtype, std::vector<int64_t> shape, const formats::Fingerprint& fp,
                                  const at::Tensor& bytes);
  // Appends `op` (its seq and thread are set here); its outputs must come
  // from Output since the last AddOp.
  absl::Status AddOp(formats::OpEvent op);
  absl::Status Annotate(const std::string& key, llvm::json::Value value);
  absl::Status EndStep(llvm::json::Object step_note);
  absl::Status Close();
  // Stops writing and removes the partial bundle, so that an import that
  // failed leaves nothing behind. The writer cannot be used after it.
  void Abandon();

  bool full() const { return full_; }
  // The seq the next op added gets.
  uint64_t next_seq() const { return next_seq_; }
  const ImportStats& stats() const { return stats_; }

 private:
  ImportWriter(std::unique_ptr<formats::BundleWriter> writer, bool full) : writer_(std::move(writer)), full_(full) {}
  absl::StatusOr<uint64_t> Add(formats::DType dtype, std::vector<int64_t> shape, const formats::Fingerprint& fp,
                               const at::Tensor& bytes, bool output);
  absl::Status Flush();

  std::unique_ptr<formats::BundleWriter> writer_;
  bool full_;
  int64_t step_ = -1;
  uint64_t next_id_ = 1, next_seq_ = 0;
  formats::OpBatch batch_;
  std::vector<size_t> pending_outputs_;  // indices into batch_.tensors of the next op's outputs
  ImportStats stats_;
};

}  // namespace moerr::importers
