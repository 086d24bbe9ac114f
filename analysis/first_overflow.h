// The first overflowing op, from fingerprints alone (DESIGN.md, "Bisect"):
// the first op in execution order whose inputs (tensors and scalars) are all
// finite and one of whose floating outputs is not (or, with a threshold,
// comes within a fraction of a dtype's range). No re-run is needed, so a
// stats bundle will do. Its cause, the op before it whose output exploded,
// is in overflow_cause.h; precision bisect, which replays, in
// replayer/precision_bisect.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/trace.h"

namespace moerr::analysis {

struct OverflowOptions {
  // An output also counts as overflowing when its abs-max exceeds `fraction`
  // of `limit` (e.g. 0.5 of fp16's 65504); 0 = only non-finite outputs.
  double fraction = 0;
  // The range that matters: fp16's or bf16's (what a lower-precision device
  // would hold), or 0 = the output's own dtype.
  double limit = 0;
};

// Largest finite value of `dtype` (floating types; integers: their maximum).
double DTypeMax(formats::DType dtype);

// OverflowOptions::limit named: "dtype" (0: each output's own), "fp16" or
// "bf16" (their largest finite value); InvalidArgument for any other name.
absl::StatusOr<double> ParseOverflowLimit(const std::string& name);

struct HeadroomPoint {
  size_t op_index = 0;
  const formats::OpEvent* op = nullptr;
  double abs_max = 0;
  double headroom_bits = 0;  // log2(limit / abs_max); 0 or less: overflowing
  formats::DType dtype = formats::DType::kF32;  // of the output it was read from
};

struct FirstOverflow {
  size_t op_index = 0;
  const formats::OpEvent* op = nullptr;
  const formats::OpEvent* forward_op = nullptr;  // for a backward op: the forward op behind it
  uint64_t output = 0;
  formats::Fingerprint fingerprint;  // of the overflowing output
  double limit = 0;                  // the range it was judged against
  // The outputs of up to 8 earlier ops of the same module and phase (of any
  // module when that module has none), oldest first: how the headroom ran out.
  std::vector<HeadroomPoint> trend;
};

// Per op in execution order, the least headroom of its floating outputs
// against `limit` (fp16's 65504, say), or with `limit` 0 against each
// output's own dtype: log2(limit / abs_max); -Inf for an output that is not
// finite. Integer and bool outputs have no headroom; ops without an
// initialised, non-zero floating output are left out.
std::vector<HeadroomPoint> HeadroomProfile(const formats::Trace& trace, double limit);

std::optional<FirstOverflow> FindFirstOverflow(const formats::Trace& trace, const OverflowOptions& options = {});

// An output holding finite values past the range of a narrower format: a
// device that held it in that format (a round-fp16 policy, an fp16 NPU)
// would turn them into Inf. Read from the fingerprints' beyond-fp16 and
// beyond-bf16 counts; `count` values, the largest `abs_max`.
struct PredictedOverflow {
  size_t op_index = 0;
  uint64_t output = 0;
  uint64_t count = 0;
  double abs_max = 0;
};
// `format`: kF16 or kBF16. Outputs already in `format` (or narrower) and
// uninitialised values are skipped.
std::vector<PredictedOverflow> PredictOverflows(const formats::Trace& trace, formats::DType format);

}  // namespace moerr::analysis
