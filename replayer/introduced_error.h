// The error each op of a recorded step introduces (diff/precision_diff.h,
// docs/REPLAY.md "Introduced error"): measured by isolated replay of a full
// recording, and the diff of two recordings judged on it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "diff/precision_diff.h"
#include "diff/world_diff.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "formats/world_run.h"
#include "replayer/program_replay.h"

namespace moerr::replayer {

// Whether `op` produced a floating output whose bytes the bundle holds: one
// MeasureIntroduced can judge.
bool Measurable(const formats::Trace& trace, const formats::OpEvent& op);

// Program replay's part of an isolated replay with ReplayOptions::introduced:
// runs op `index` of `trace` on `exact` (its arguments widened to fp64)
// without autocast and appends to report.introduced, for each floating
// output the bundle holds, the recorded and the `replayed` (this machine's
// outputs in the recorded dtypes) outputs' errors against that run. An op
// that has no fp64 kernel is counted in report.no_exact_run.
absl::Status MeasureIntroduced(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                               size_t index, const c10::OperatorHandle& handle, std::vector<c10::IValue> exact,
                               const std::vector<at::Tensor>& replayed, ReplayReport& report);

// How two matched calls differ beyond what a precision or a device changes
// (dtype, device, layout and memory-format arguments; tensors; a
// collective's hashes of what it moved): "argument 1 (other): 1 vs 1.01",
// or "".
std::string CallDifference(const formats::OpEvent& a, const formats::OpEvent& b);

struct PrecisionDiffOptions {
  diff::DiffOptions diff;
  // Full recordings: measure each op's introduced error by an isolated
  // replay of each side. Otherwise (or false) it is estimated.
  bool measure = true;
  std::function<void(const std::string& what)> progress;  // "replaying A", ...
};

// `a` and `b` diffed (diff::DiffTraces) and judged on introduced error
// (diff::JudgePrecision). A side that cannot be replayed isolated (not a
// full recording, an imported dump) makes the judgement an estimate, and
// says why in PrecisionDiff::estimated_because.
absl::StatusOr<diff::PrecisionDiff> DiffPrecisions(const formats::BundleReader& reader_a, const formats::Trace& a,
                                                   int64_t step_a, const formats::BundleReader& reader_b,
                                                   const formats::Trace& b, int64_t step_b,
                                                   const PrecisionDiffOptions& options);

// Two multi-rank runs of a step (diff::DiffWorlds' parts: rank by rank, or
// expert by expert), each part judged as DiffPrecisions judges two bundles.
struct PrecisionPart {
  std::string what;  // "rank 2", "expert 5"
  int64_t rank_a = 0, rank_b = 0;
  formats::Trace a, b;
  diff::PrecisionDiff precision;
};
absl::StatusOr<std::vector<PrecisionPart>> DiffWorldPrecisions(const formats::WorldStep& a,
                                                               const formats::WorldStep& b,
                                                               const PrecisionDiffOptions& options);

}  // namespace moerr::replayer
