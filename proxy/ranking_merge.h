// Several proxy-eval reports ranked together: one table measured in pieces.
// Issue 44's table takes longer than one run can, so it is run a few methods
// at a time, each run with the random baseline; `moerr proxy-eval --rank
// A.json B.json ...` then applies the rule of method_ranking.h to all of
// them. Each report's ranking (its --json, under "ranking") holds every
// method's scores per group (keep, healing); the merge pools them per group
// and decides again. A fault score counts against the random row of its own
// run, so the pieces must be of one table, or the merge is refused:
//  - the same model and setting: preset, family, experts, static_only,
//    trainer_seeds and the original's accuracy (the warm model and its
//    sample problems) are equal;
//  - a group in two reports was judged on the same criteria in both;
//  - a method in one group of two reports is the same measurement there
//    (every score equal). Each run has random, so this checks that the runs
//    used the same seeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "proxy/method_ranking.h"

namespace moerr::proxy {

// One proxy-eval --json report: what identifies its table, and its ranking.
struct RankingPart {
  std::string path;  // for messages
  std::string preset, family;
  int64_t experts = 0, trainer_seeds = 0;  // trainer_seeds 0: static only
  bool static_only = false;
  double original_accuracy = 0;
  MethodRanking ranking;
};

// An error naming `path` for a file that is not a proxy-eval --json report
// with a ranking.
absl::StatusOr<RankingPart> ReadRankingPart(const std::string& path);

// The rule over the parts' groups pooled (groups and methods in order of
// first appearance), or an error naming the two files that disagree, where
// and how. Notes: the parts' own, and which reports were pooled.
absl::StatusOr<MethodRanking> MergeRankings(const std::vector<RankingPart>& parts);

// {"reports": [paths], "ranking": ...}, for --json.
llvm::json::Object MergedRankingJson(const std::vector<RankingPart>& parts, const MethodRanking& ranking);

}  // namespace moerr::proxy
