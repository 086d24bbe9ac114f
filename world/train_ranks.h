// `moerr train --ranks N --ep E`: the launcher side (start N ranks of this
// command, wait, report any rank that died or hung) and the rank side (join
// the world from the environment a launcher set), over distributed/'s
// launcher and process groups.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/process_group.h"
#include "moe/training_run.h"
#include "support/exit_code.h"

namespace moerr::world {

struct RanksOptions {
  int64_t ranks = 1;
  int64_t ep = 1;
  double collective_timeout_s = 60;
  double deadline_s = 0;
  std::string store = "file";  // file or tcp
  std::string rank_fault;      // "", or NAME:K[@N], NAME a rank fault of moe/faults/faults.def
  std::vector<std::pair<std::string, std::string>> env;  // more variables for every rank
  bool quiet = false;          // no "launching ..." line (a command printing JSON)
};

// Runs the ranks and returns the command's exit code: 0 when every rank
// exited 0; the status the failed ranks exited with when they all exited
// with the same one (2 for bad input every rank rejects); otherwise
// kExitInternal (a rank was killed by a signal, hung, or the ranks disagree).
// Prints each failed rank's fate. A bad option or a launch that could not
// start is the status returned instead.
ExitOr LaunchRanks(const RanksOptions& options);

// InvalidArgument naming the first multi-rank option (--ep, --store,
// --deadline, --collective-timeout, --rank-fault) set away from its default:
// a one-process run, neither launching nor joining ranks, would ignore it.
absl::Status CheckOneProcess(const RanksOptions& options);

// A rank's world and the training observer that applies --rank-fault on it
// (moe/faults/rank_fault.h).
struct RankSession {
  distributed::RankEnv env;
  std::unique_ptr<moe::Parallel> parallel;
  // Null without --rank-fault for this rank. Declared after `parallel`, so
  // destroyed first: it removes itself from the collectives' observers.
  // Goes after any recorder in the run's observers (moe::MakeRankFault).
  std::unique_ptr<moe::TrainObserver> fault;
};
absl::StatusOr<RankSession> JoinAsRank(const distributed::RankEnv& env, const RanksOptions& options);

}  // namespace moerr::world
