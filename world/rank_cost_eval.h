// `moerr proxy-eval --ranks N`: what a proxy on fewer ranks costs and
// whether it still shows the fault (docs/DISTRIBUTED.md, "Proxies on fewer
// ranks"). For each fault, as a user would: `moerr train --ranks N --ep N
// --fault F --record replayable` (the faults in one rank's weights on rank
// N - 3, rank 0 when N < 3), for each kept fraction `moerr proxy RUN --keep
// K` (M = K x N ranks: the experts and tokens per rank kept), then, each
// round, `moerr replay RUN --ranks N` (the original's step on its own
// ranks) and `moerr replay P` of each proxy. Each is this executable in a child process,
// its output in OUT/<fault>/; the numbers come from the replays' --json:
//   step time per rank  the mean over ranks of each rank's CPU seconds in
//                       the step (ranks oversubscribe the machine's cores,
//                       so wall time says little)
//   device time         their sum: ranks x step time per rank
//   (each the median of the rounds)
//   reproduced, localised  the replay's failure verdict (failure_verdict.h)
// The projection for a real model is computed, not measured, and labelled so.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "support/exit_code.h"

namespace moerr::world {

struct RankCostOptions {
  std::string preset = "wide-ep";
  int64_t ranks = 8;  // N
  int64_t warmup_steps = 20;
  std::vector<std::string> faults;  // fault names
  std::vector<std::string> keeps = {"1/2", "1/4", "1/8"};
  std::string out_dir;  // required
  double collective_timeout_s = 60;
  // Replays of each step (the original's and each proxy's, interleaved);
  // each cost is their median, and their failure verdicts must agree.
  int64_t rounds = 1;
  // Seconds each child command (train, replay, proxy) may run before it is
  // killed and reported; train gets it as its --deadline too.
  double child_timeout_s = 1800;
};

struct RankCostRow {
  std::string fault, keep;  // keep "1": the original on its own ranks
  int64_t ranks = 0;
  double step_seconds_per_rank = 0, device_seconds = 0;
  double lower_by = 1;  // the original's device time / this one's
  std::string failure;  // the failure's kind; "" when the original shows none
  bool shown = false;   // the original shows a failure (and the proxy trains on a rank that does)
  bool reproduced = false, localised = false;
};

struct RankCostReport {
  std::string preset;
  int64_t ranks = 0;
  std::vector<RankCostRow> rows;
  // Faults that failed (a child that exited 2 or more, was killed or timed
  // out, or a replay without its cost): the rows done before stay.
  std::vector<std::string> errors;
};

using RankCostProgress = std::function<void(const std::string& what)>;
absl::StatusOr<RankCostReport> EvaluateRankCost(const RankCostOptions& options, const RankCostProgress& progress);

// The projection for the seed paper's setting (256 experts at EP 64, proxied
// to 16 experts on 4 devices with the experts and tokens per device kept):
// devices and device time per step, from the ranks alone.
struct RankCostProjection {
  int64_t experts = 256, ep = 64, proxy_experts = 16, proxy_devices = 4;
  double device_time_ratio() const { return double(ep) / double(proxy_devices); }
};

void PrintRankCost(const RankCostReport& report);
// EvaluateRankCost with its progress on stderr, the table on stdout and, with
// `json_path`, RankCostJson there; then the failed faults' errors (an error
// exit).
ExitOr RunRankCost(const RankCostOptions& options, const std::string& json_path);
llvm::json::Object RankCostJson(const RankCostReport& report);

}  // namespace moerr::world
