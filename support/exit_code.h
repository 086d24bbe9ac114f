// The exit codes of the `moerr` command, the same for every subcommand
// (README, "Exit codes"), and what an entry point that runs one returns:
//   0 ok; 1 the check ran and found a problem (a finding a script would
//   branch on); 2 bad input or usage (a missing, empty or non-bundle file, a
//   bad option, an output that cannot be written); 3 an internal error (a
//   bug in moerr: an absl kInternal or kUnknown status, or an exception that
//   reached main).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moerr {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFinding = 1;
inline constexpr int kExitError = 2;
inline constexpr int kExitInternal = 3;

// What an entry point that a subcommand runs returns: kExitOk or
// kExitFinding when it ran, or the status that stopped it.
using ExitOr = absl::StatusOr<int>;

// The exit code of a failed `status`: kExitInternal for kInternal and
// kUnknown (moerr's own invariants broke), kExitError for every other code
// (the input, the options or the file system).
inline int ExitCodeOf(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  return code == absl::StatusCode::kInternal || code == absl::StatusCode::kUnknown ? kExitInternal : kExitError;
}

}  // namespace moerr
