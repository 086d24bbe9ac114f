// Two multi-rank runs of a step compared (formats/world_run.h). Worlds of
// the same size are compared rank by rank. Worlds of different sizes hold
// an expert on different ranks, so they are compared expert by expert, by
// module path: each expert's ops on the rank of each world that hosts it.
// An expert gets its rows from every sender in rank order, so on the same
// global batch it sees the same rows in both worlds; the dense ops are not
// compared, since a rank of each world holds another shard of the batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "diff/trace_diff.h"
#include "formats/world_run.h"

namespace moerr::diff {

struct WorldDiffPart {
  std::string what;              // "rank 2", "expert 5"
  int64_t rank_a = 0, rank_b = 0;
  formats::Trace a, b;           // the ops compared (a rank's step, or the part of it named by `what`)
  DiffReport report;
};

// Every part of the two steps, in order. A rank either run could not read
// is an error naming it.
absl::StatusOr<std::vector<WorldDiffPart>> DiffWorlds(const formats::WorldStep& a, const formats::WorldStep& b,
                                                      const DiffOptions& options);

}  // namespace moerr::diff
