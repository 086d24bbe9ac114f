// `moerr replay RUN --ranks M`: a recorded N-rank step re-executed on M
// ranks (replayer/world_replay.h). The launcher side starts M ranks of this
// command (M = 1: the whole world in this process), each of which replays
// its part and records it to OUT/rank<m>.moerr; then it compares the replay
// with the record: the step's metrics, every expert's ops (by module path,
// on the rank of each world that hosts it; rank by rank when M = N), and
// the first overflow, which must be the same op of the same expert.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/exit_code.h"

namespace moerr::world {

struct ReplayRanksArgs {
  std::string run;
  std::vector<int64_t> steps;  // at most one; default the first step rank 0 completed
  int64_t ranks = 0;           // M; 0: the run's own (a proxy run's)
  std::string out;             // keep the replayed run here; default a temporary directory
  bool force = false, json = false;
  double collective_timeout_s = 60;
};

ExitOr ReplayOnRanks(const ReplayRanksArgs& args);

// Step `step` of `run` (-1: the first rank 0 completed) replayed in this
// process, the whole world on one rank, into the run directory `out`
// (created; its bundles overwritten), without comparing: for the commands
// that read a proxy run's ops (bisect).
absl::Status ReplayInProcess(const std::string& run, int64_t step, const std::string& out);

// Starts `ranks` ranks of this command (EP size `ep`) replaying into `out`,
// each told `out` through the environment, and waits for them: OK when
// every rank exited 0, else why not (each failed rank's fate printed above).
absl::Status LaunchReplayRanks(const ReplayRanksArgs& args, int64_t ranks, int64_t ep, const std::string& out);

}  // namespace moerr::world
