// moerr reduce (DESIGN.md, "Bisect"): delta-debug a failing step to the
// smallest one that still fails the same way. Passes (proxy/passes/) propose
// smaller steps: fewer experts per layer, fewer decoder layers, shorter
// responses, fewer prompts or responses per prompt. A candidate is kept when
// model replay shows the same failure:
//   - an overflow: the replay's first overflow is in the same phase and
//     module class as the recorded one;
//   - otherwise the recorded step's worst lint finding (a warning or an
//     error: lost update, collapsed load, mixed precisions): the replayed
//     step raises a warning of the same check in the same phase and module
//     class.
// Passes repeat until none makes progress. A step without recorded ops (a
// proxy's, or an earlier reduction's) fails as its own model replay does.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "replayer/step_failure.h"

namespace moerr::proxy {

struct ReduceOptions {
  int64_t step = -1;        // default: the first recorded step that fails
  std::string out_path;     // required: the reduced bundle
  std::string work_dir;     // required: candidates and their replays
  std::string source = "the bundle";  // the bundle's path, named in errors
};

struct ReduceRow {
  std::string pass, removed;
};

// What a step's replay costs: the model and the batch.
struct StepSize {
  int64_t params = 0;  // policy parameters
  int64_t layers = 0, experts = 0;
  int64_t prompts = 0, group_size = 0, response_tokens = 0;
};

// The failure a reduction keeps.
using ReduceFailure = replayer::Failure;

struct ReduceReport {
  int64_t step = 0;
  ReduceFailure failure;
  std::vector<ReduceRow> accepted;  // in the order they were taken
  int64_t tried = 0;                // candidates replayed
  StepSize before, after;
  double seconds = 0;
};

using ReduceProgress = std::function<void(int64_t tried, const std::string& note)>;

absl::StatusOr<ReduceReport> Reduce(const formats::BundleReader& reader, const ReduceOptions& options,
                                    const ReduceProgress& progress = nullptr);

}  // namespace moerr::proxy
