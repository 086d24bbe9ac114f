// Two multi-rank runs of a step compared (formats/world_run.h). Worlds of
// the same size are compared rank by rank. Worlds of different sizes hold
// an expert on different ranks, so they are compared by module path: the
// dense ops (every module that is no expert) of rank 0 of each, then each
// expert's ops on the rank of each world that hosts it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "diff/trace_diff.h"
#include "formats/world_run.h"

namespace moerr::diff {

struct WorldDiffPart {
  std::string what;              // "rank 2", "dense ops", "expert 5"
  int64_t rank_a = 0, rank_b = 0;
  formats::Trace a, b;           // the ops compared (a rank's step, or the part of it named by `what`)
  DiffReport report;
};

// Every part of the two steps, in order. A rank either run could not read
// is an error naming it.
absl::StatusOr<std::vector<WorldDiffPart>> DiffWorlds(const formats::WorldStep& a, const formats::WorldStep& b,
                                                      const DiffOptions& options);

}  // namespace moerr::diff
