// Whether a world replayed on fewer ranks (a recording's replay, or a proxy
// run's) shows the recorded run's failure, rank by rank
// (replayer/world_failure.h; docs/DISTRIBUTED.md, "The failure on fewer
// ranks"). Each original rank that shows the failure is looked for on the
// replay ranks that stand for it: a recording's replay rank r / k, a proxy's
// rank that trains on r's shard, and the rank hosting an expert the failure
// is in. Reproduced: every rank looked for shows a failure of the same kind;
// localised: in the same phase and module class and in a module that stands
// for the original's (the same expert, or the kept expert its cluster maps
// to, named with its original rank). With the fault on one rank, only that
// rank is judged, and a finding the healthy ranks give as much is "not
// discriminating" rather than reproduced.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "replayer/world_failure.h"
#include "world/world_replay_comparison.h"

namespace moerr::world {

struct FailureRow {
  replayer::RankFailure recorded;
  std::vector<int64_t> looked_at;  // replay ranks; empty: the rank's shard is not in the proxy
  int64_t shown_rank = -1;         // the replay rank of the best match
  replayer::Shown shown;
  // Whether the finding stands out from the original's healthy ranks (those
  // the run's fault was not on): they show no warning of its rule, or (a
  // rule with a measure) a smaller one than both the recorded and the shown
  // finding. A finding every rank gives shows nothing of the fault.
  bool discriminating = true;
  bool reproduced() const { return !looked_at.empty() && shown.level != replayer::Reproduction::kNo && discriminating; }
};

struct FailureVerdict {
  std::string kind;                              // replayer::WorldFailure's
  std::optional<replayer::RecordedFault> fault;  // the fault the run names
  // With the fault on one rank (fault->rank >= 0) and a lint check's
  // failure, only that rank's row is judged; the other ranks that warned of
  // the rule are the healthy bar: their largest measure (+inf: a rule
  // without one), nullopt when none warned.
  std::vector<FailureRow> rows;
  std::vector<int64_t> healthy_ranks;  // healthy ranks that warned of the rule
  std::optional<double> healthy_bar;
  int64_t judged() const;  // rows looked for
  bool reproduced() const;
  bool localised() const;
  bool discriminating() const;
};

// The verdict for `c` (CompareWorldReplay's). A proxy run carries its
// original's failure in its "proxy" annotation ("failures"); nullopt when
// it records none (a proxy made before it did).
absl::StatusOr<std::optional<FailureVerdict>> JudgeFailure(const WorldReplayComparison& c);

void PrintFailureVerdict(const FailureVerdict& v, const WorldReplayComparison& c);
// With a named kind (the run's fault's): a recording's replay is a finding
// (kExitFinding) when the failure does not reproduce; a proxy's when a
// failure was recorded (the proxy shows it, or it does not reproduce), as
// for an overflow. Each rank's worst warning of a run that names no fault is
// shown, not judged.
int FailureExitCode(const FailureVerdict& v, bool proxy);
llvm::json::Object FailureVerdictJson(const FailureVerdict& v, const WorldReplayComparison& c);

}  // namespace moerr::world
