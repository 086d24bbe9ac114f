// `moerr bisect` of a multi-rank run directory: each step's first overflow in
// causal order across the ranks (analysis/world_overflow.h), the rank it
// began on, its cause and spread, and each rank's vendor ops against their
// references; a proxy run's step is replayed first to give it ops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/first_overflow.h"
#include "replayer/op_references.h"
#include "support/exit_code.h"

namespace moerr::world {

// Bisects `steps` of the run at `dir` (every step rank 0 completed when
// empty), printing each or, when `json`, printing one JSON array.
// kExitFinding when an op overflows or a vendor op is suspect.
ExitOr RunWorldBisect(const std::string& dir, std::vector<int64_t> steps, const analysis::OverflowOptions& options,
                      const replayer::OpReferences& references, bool json);

// A proxy run (moerr proxy RUN) records no ops: its one step is replayed in
// this process (its ranks as one; the placement still names the proxy rank
// of each expert) into a temporary run, which RunWorldBisect bisects.
ExitOr BisectProxyRun(const std::string& dir, const std::vector<int64_t>& steps,
                      const analysis::OverflowOptions& options, const replayer::OpReferences& references, bool json);

}  // namespace moerr::world
