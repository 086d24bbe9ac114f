// What the subcommands share for a multi-rank run directory (world.json and
// one bundle per rank, formats/world_manifest.h): picking ranks, and the
// cross-rank check of what the ranks exchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/world_manifest.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"
#include "support/exit_code.h"

namespace moerr::world {

// The bundles a command reads from `path`: the file itself when it is a
// bundle; every rank's, or rank `rank`'s (>= 0), when it is a run directory.
struct RankBundle {
  int64_t rank = -1;  // -1: not part of a run
  std::string path;
  bool partial = false;  // a rank's unfinished bundle (RUN/rankK.moerr.partial: the rank died)
};
absl::StatusOr<std::vector<RankBundle>> BundlesOf(const std::string& path, int64_t rank = -1);

// The one bundle a single-rank command (reduce) reads from `path`: the file
// itself when it is a bundle; in a run directory, rank `rank`'s (>= 0), or
// else, in step `step` (the first step where the run overflowed when -1),
// a rank whose first overflow an op of its own made (not values that
// arrived in a collective, which a reduce of one rank cannot replay): where
// the overflow began (analysis::FindWorldOverflow, as bisect names it), else
// the rank bisect's walk across ranks started on, else the first such rank;
// FailedPrecondition when there is none. `why` is set to the reason so
// found (", where the overflow began"; empty for a bundle or `rank`).
absl::StatusOr<RankBundle> OneRankOf(const std::string& path, int64_t rank, int64_t step, std::string* why = nullptr);

// "rank 3: " for a rank of a run, "" for a lone bundle.
std::string RankPrefix(const RankBundle& b);

// Whether `b` is a rank's unfinished bundle (RUN/rankK.moerr.partial): the
// commands that need a finished one (replay, lint) skip it, saying so on
// stderr with how to salvage it, and return true.
bool SkipUnfinished(const RankBundle& b);

// The steps a command reads from an opened run (formats::OpenWorld):
// `requested`, or every step rank 0 completed, or else the first step any
// rank has (a run that died in its first step).
absl::StatusOr<std::vector<int64_t>> RunSteps(formats::WorldStep& world, const std::vector<int64_t>& requested);

// The cross-rank check (analysis/cross_rank.h) of `steps` of the run at
// `dir` (when empty: every step rank 0 completed, else the first step):
// prints each mismatch
// (the collective, the sender, the receiver, the slice) or adds them to
// `json`. Returns kExitFinding when any, else kExitOk.
ExitOr CheckRunCollectives(const std::string& dir, const std::vector<int64_t>& steps,
                           llvm::json::Array* json);

}  // namespace moerr::world
