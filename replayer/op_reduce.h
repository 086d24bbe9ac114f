// The op-level reduce (`moerr reduce` on a step moerr cannot rebuild as a
// model: a plain PyTorch loop's, any replayable or full recording;
// docs/REPLAY.md, "Reducing a step op by op"). It delta-debugs the recorded
// op sequence itself.
//
// The failure kept is the step's first overflow (analysis::FindOverflowCause:
// the first op that makes Inf or NaN from finite inputs) and, when an op
// before it exploded, that cause: a candidate fails when its replay's first
// overflow is the same recorded op and its cause is the same recorded op.
//
// A candidate is a subset of the ops up to the first overflow, in recorded
// order, the first overflow always in it. Every tensor a kept op reads that no
// kept op produces is cut free: its value, as one replay of the whole step
// made it (ReplayOptions::capture), becomes a leaf. Candidates, each replayed
// by ReplayTrace as `moerr replay` does:
//   1. the ops the first overflow depends on (its backward slice);
//   2. the shortest suffix of those that still fails (binary search);
//   3. ddmin (Zeller) over the rest, re-sliced after each cut, until no single
//      op can be removed: 1-minimal;
//   4. the rows of the values cut free halved while it still fails
//      (row_shrink.h).
// Output: a bundle with only the kept ops and the values feeding them, and a
// standalone repro (repro_script.h) beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "replayer/step_failure.h"

namespace moerr::replayer {

struct OpReduceOptions {
  int64_t step = -1;       // default: the first complete step that overflows
  std::string out_path;    // required: the reduced bundle
  // Required: the repro script and its values (safetensors) to write.
  std::string script_path, values_path;
  std::string work_dir;    // required: the value pool the candidates read
  std::string source = "the bundle";  // the bundle's path, named in errors
};

struct OpReduceReport {
  int64_t step = 0;
  Failure failure;              // the first overflow, as step_failure.h describes it
  size_t first_overflow = 0;    // its op index in the recorded step
  std::optional<size_t> cause;  // the op index of its cause, when an op before it exploded
  size_t ops_before = 0;        // ops in the recorded step
  std::vector<size_t> kept;     // recorded op indices kept, in execution order
  uint64_t bytes_before = 0, bytes_after = 0;  // file sizes: the recording, the reduced bundle
  int64_t tried = 0;            // candidates replayed (each distinct op set once, then each shrink)
  // Elements of the values feeding the kept ops, before and after their rows
  // were shrunk.
  int64_t elements_before = 0, elements_after = 0;
  double seconds = 0;           // the whole reduction
  double replay_seconds = 0;    // of it, the one replay of the step up to the first overflow
  std::string assertion;        // what the repro asserts, "op 3 aten::linear produces Inf from finite inputs"
};

using OpReduceProgress = std::function<void(int64_t tried, const std::string& note)>;

// Whether step `step` (-1: some complete step) of the recording overflows:
// whether ReduceOps has a failure to keep. `source` names it in errors.
absl::StatusOr<bool> Overflows(const formats::BundleReader& reader, int64_t step, const std::string& source);

absl::StatusOr<OpReduceReport> ReduceOps(const formats::BundleReader& reader, const OpReduceOptions& options,
                                         const OpReduceProgress& progress = nullptr);

}  // namespace moerr::replayer
