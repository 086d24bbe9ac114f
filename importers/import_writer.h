// Writes an imported step as a bundle the way the recorder does
// (recorder/recorder.cpp): a "recording" annotation, then per step its ops
// as `ops` records (OpBatch: events and the metadata of the tensors they
// first name), and in full bundles each tensor's bytes, op outputs as
// "act/<id>" (role activation) and other inputs as "in/<id>" (role leaf), so
// diff compares bytes and bisect reads fingerprints exactly as for a
// recording.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_writer.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"

namespace moerr::importers {

struct ImportStats {
  uint64_t steps = 0, ops = 0, tensors = 0;  // tensors: metadata written (values, not files)
  uint64_t tensor_bytes = 0;                 // bytes of the tensors stored (full bundles)
};

struct ImportOptions {
  bool overwrite = false;
  // Called after each dump entry: (dumps done, entries done in this dump,
  // entries in this dump).
  std::function<void(const std::string& label, int64_t done, int64_t total)> progress;
};

struct ImportResult {
  std::vector<std::string> bundles;  // written, one per rank
  std::string manifest;              // RUN/world.json, or "" when not written
  ImportStats stats;                 // summed over the bundles
  std::string task, level;
  uint64_t missing_files = 0;        // tensor-task values whose file was absent: imported from statistics
  uint64_t unsupported = 0;          // tensors of dtypes moerr does not store (complex, ...): not tensors here
  // torch: entries that are not tensors (numbers, strings...), kept in the
  // "imported_values" annotation; entries not read, with why ("imported_skipped").
  uint64_t values = 0;
  std::vector<std::pair<std::string, std::string>> skipped;
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

// Makes `run_dir`; with `overwrite`, removes the manifest and bundles of an
// earlier run there, so that none of them is left to look like part of the
// one imported now.
absl::Status PrepareRunDirectory(const std::string& run_dir, bool overwrite);

}  // namespace moerr::importers
