// The launcher of `moerr train --ranks N`, in the way of torchrun, and of
// any other child that runs this executable (proxy-eval's runs): N rank
// processes, each this executable (/proc/self/exe) with the same arguments
// and RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the store's
// address in its environment; then it waits for them. Plain POSIX (fork,
// exec, waitpid): no LibTorch here.
//
// It never hangs: when a rank dies (non-zero exit or a signal), the others
// get `grace_s` to fail their collectives and say where (their collective
// timeout fires), then are stopped (SIGTERM, then SIGKILL); past
// `deadline_s` every rank still running is reported hung and killed. A
// rank dies with the launcher (PR_SET_PDEATHSIG).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace moerr::distributed {

struct LaunchOptions {
  int64_t ranks = 1;
  std::vector<std::string> argv;                            // argv[0] included; run as /proc/self/exe
  std::vector<std::pair<std::string, std::string>> env;     // added to every rank's environment
  double grace_s = 2;      // after the first failure, before the rest are stopped
  double deadline_s = 0;   // the whole run; 0: none
  // false: a plain child (a whole `moerr` command, which may launch ranks
  // of its own), without RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE.
  bool rank_env = true;
  // One process (ranks == 1): its stdout and stderr written there
  // (truncated); empty: inherited.
  std::string stdout_path, stderr_path;
};

struct RankOutcome {
  enum class Kind {
    kOk,        // exit status 0
    kExited,    // a non-zero exit status
    kSignaled,  // killed by a signal it was not sent by the launcher
    kStopped,   // still running after another rank failed: stopped by the launcher
    kHung,      // still running at the deadline: killed by the launcher
  };
  int64_t rank = 0;
  Kind kind = Kind::kOk;
  int code = 0;         // exit status, or the signal
  double seconds = 0;   // from launch to its end
};

struct LaunchResult {
  std::vector<RankOutcome> ranks;  // by rank
  bool ok() const;
  // One line per rank that did not exit 0, the first failure first:
  // "rank 1: killed by signal 9 (SIGKILL) after 1.2 s".
  std::string Describe() const;
};

// This process's arguments, as /proc/self/cmdline holds them.
absl::StatusOr<std::vector<std::string>> OwnArguments();

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options);

}  // namespace moerr::distributed
