// moerr reduce (DESIGN.md, "Bisect"): delta-debug a failing step to the
// smallest one that still fails the same way. Passes (proxy/passes/) propose
// smaller steps: fewer experts per layer, fewer decoder layers, fewer
// prompts; a candidate is kept when model replay shows its first overflow
// in the same phase and module class as the recorded one. Passes repeat
// until none makes progress. Steps whose failure is not an overflow (lint
// names those) are not reduced.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"

namespace moerr::proxy {

struct ReduceOptions {
  int64_t step = -1;        // default: the first recorded step with an overflow
  std::string out_path;     // required: the reduced bundle
  std::string work_dir;     // required: candidates and their replays
};

struct ReduceRow {
  std::string pass, removed;
};

struct ReduceReport {
  int64_t step = 0;
  std::string phase, module_class;   // of the failure, kept throughout
  std::vector<ReduceRow> accepted;   // in the order they were taken
  int64_t tried = 0;                 // candidates replayed
  int64_t params_before = 0, params_after = 0;
  int64_t layers_before = 0, layers_after = 0, experts_before = 0, experts_after = 0;
  int64_t prompts_before = 0, prompts_after = 0;
  double seconds = 0;
};

using ReduceProgress = std::function<void(int64_t tried, const std::string& note)>;

absl::StatusOr<ReduceReport> Reduce(const formats::BundleReader& reader, const ReduceOptions& options,
                                    const ReduceProgress& progress = nullptr);

}  // namespace moerr::proxy
