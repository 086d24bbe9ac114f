// What `moerr replay RUN --ranks M` found (replay_ranks.h): the replayed
// run against the recorded one, step by step.
//   - A recording: the step's metrics (world totals), every expert's ops on
//     the rank of each world hosting it (rank by rank when M = N), each
//     bitwise, within the per-dtype tolerance or diverged; on fewer ranks,
//     each replay rank's dense ops against the combined fingerprints of the
//     ranks it stands for (diff/world_dense_diff.h); and the first overflow,
//     which must be the same op of the same module.
//   - A proxy run (`moerr proxy RUN --ranks M`, no ops, a "proxy"
//     annotation): the original's metrics beside the proxy's, the proxy's
//     first overflow with the original expert and rank its expert stands
//     for, and whether it is the original's failure: the same phase and
//     module class, in the original's failing expert or the kept expert its
//     cluster maps to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/world_overflow.h"
#include "diff/world_dense_diff.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"
#include "replayer/world_replay.h"

namespace moerr::world {

struct ReplayedPart {
  std::string what;  // "expert 5", "rank 2"
  int64_t recorded_rank = 0, replay_rank = 0;
  size_t ops = 0, bitwise = 0, diverged = 0, unmatched = 0;
  double max_error = 0;
  std::string worst;  // the op with the largest error
};

struct WorldReplayComparison {
  int64_t step = 0;
  replayer::WorldReplayPlan plan;
  llvm::json::Object recorded_metrics, replayed_metrics;
  std::vector<ReplayedPart> parts;     // empty for a proxy run
  std::vector<diff::DenseDiff> dense;  // on fewer ranks: each replay rank's dense ops
  // Each replay rank's CPU seconds in the step (its "replay_time"): the
  // step's device time is their sum, ranks x the mean step time.
  std::vector<double> rank_cpu_seconds;
  std::optional<llvm::json::Object> proxy;  // the proxy run's "proxy" annotation
  // The two runs' step; the overflows point into their traces (moving the
  // vector of ranks keeps them in place).
  formats::WorldStep recorded_run, replayed_run;
  std::optional<analysis::WorldOverflow> recorded, replayed;
};

// The "proxy" annotation of a run's rank 0, when the run is a proxy.
std::optional<llvm::json::Object> ProxyOfRun(const formats::WorldStep& run);
// Whether `path` is a proxy run's directory (moerr proxy RUN).
bool IsProxyRun(const std::string& path);

// The original expert a proxy's expert module stands for (its "proxy"
// annotation's plan), and the original rank that hosted it; nullopt for a
// module that is not an expert of the plan.
struct OriginalExpert {
  int64_t layer = 0, expert = 0, rank = 0;
  int64_t proxy_rank = 0;  // the proxy rank hosting the proxy's expert (placement)
};
std::optional<OriginalExpert> OriginalOf(const llvm::json::Object& proxy, const std::string& module);

// Whether a proxy's module path `shown` stands for the original's
// `original`: the same expert (the proxy's expert is it, or the kept expert
// its cluster maps to), or the same path outside the experts.
bool StandsFor(const llvm::json::Object& proxy, const std::string& shown, const std::string& original);
// The proxy rank hosting the original's expert `expert` of `layer`, or the
// kept expert its cluster maps to (the placement); nullopt when neither.
std::optional<int64_t> ProxyRankOf(const llvm::json::Object& proxy, int64_t layer, int64_t expert);

absl::StatusOr<WorldReplayComparison> CompareWorldReplay(const std::string& run, const std::string& replay,
                                                         int64_t step, const replayer::WorldReplayPlan& plan);

// Whether the replay shows the recorded failure (none when none was recorded).
bool Reproduced(const WorldReplayComparison& c);
void PrintWorldReplay(const WorldReplayComparison& c);
llvm::json::Object WorldReplayJson(const WorldReplayComparison& c);
// A recording: kExitFinding when an op diverged or did not match, a replay
// rank's dense ops could not be judged, a metric differs past fp32 rounding
// (1e-5 relative), or the overflow did not reproduce. A proxy:
// kExitFinding when the replay overflows or does not show the original's
// failure.
int WorldReplayExitCode(const WorldReplayComparison& c);

}  // namespace moerr::world
