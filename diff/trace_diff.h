// Diff of two recorded traces of the same step (DESIGN.md, "Diff"): align
// the ops, compare each matched op's outputs (on their bytes when both
// bundles hold them, i.e. full recordings; on fingerprints otherwise), and
// judge each against a per-dtype threshold.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "diff/tensor_metrics.h"
#include "diff/trace_alignment.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"

namespace moerr::diff {

// The largest acceptable relative L2 error of an output, by dtype; a pair of
// outputs is judged by the lower precision of the two (f32 against bf16:
// bf16's). Defaults: a few units in the last place, scaled for
// accumulation: f64 1e-9, f32 1e-5, f16 2e-3, bf16 1.6e-2; integers and bool 0.
class Thresholds {
 public:
  Thresholds();
  // "f32=1e-4" (dtype names as `moerr inspect` prints them).
  absl::Status Set(absl::string_view spec);
  double For(formats::DType dtype) const { return rel_l2_[static_cast<int>(dtype)]; }
  // "f64 1e-09, f32 1e-05, ...": every non-zero threshold, for help text.
  std::string Text() const;

 private:
  std::array<double, formats::kNumDTypes> rel_l2_;
};

struct OutputDiff {
  size_t slot = 0;              // position among the op's outputs
  uint64_t a_id = 0, b_id = 0;
  formats::DType a_dtype = formats::DType::kF32, b_dtype = formats::DType::kF32;
  std::optional<TensorMetrics> tensors;  // when both bundles hold the bytes
  FingerprintDelta fingerprints;
  double error = 0;             // tensors->rel_l2, or else fingerprints.Score()
  uint64_t nan_mismatch = 0, inf_mismatch = 0;
  bool diverged = false;
  std::string note;             // why it diverged when the values could not be compared
};

struct OpDiff {
  int64_t a = -1, b = -1;       // op indices; -1: only in the other trace
  std::vector<OutputDiff> outputs;
  double error = 0;             // the largest output error
  bool diverged = false;        // an output beyond its threshold, or a NaN/Inf mismatch
};

struct DiffReport {
  std::vector<OpDiff> ops;      // in alignment order
  size_t matched = 0, only_a = 0, only_b = 0;
  size_t outputs_compared = 0, tensors_compared = 0, diverged_ops = 0;
  uint64_t bytes_compared = 0;  // tensor bytes read on both sides
  std::optional<size_t> first_divergence;  // index into `ops`
};

struct DiffOptions {
  Thresholds thresholds;
  int64_t max_edits = 8192;     // see AlignKeys
  bool compare_bytes = true;    // use recorded bytes when both sides have them
  int threads = 0;              // for the comparisons on bytes; 0: one per core
};

// `a` and `b` are traces read from `reader_a` and `reader_b` (steps
// `step_a`, `step_b`; the readers supply the bytes of full recordings). The
// outputs compared on bytes are compared after the alignment, all together,
// streamed chunk by chunk on options.threads threads (CompareBlobPairs).
absl::StatusOr<DiffReport> DiffTraces(const formats::BundleReader& reader_a, const formats::Trace& a, int64_t step_a,
                                      const formats::BundleReader& reader_b, const formats::Trace& b, int64_t step_b,
                                      const DiffOptions& options = {});

}  // namespace moerr::diff
