// Several proxy-eval reports ranked together: one table measured in pieces.
// Issue 44's table takes longer than one run can, so it is run a few methods
// at a time, each run with the random baseline; `moerr proxy-eval --pool
// A.json B.json ...` then applies the rule of method_ranking.h to all of
// them. Each report's ranking (its --json, under "ranking") holds every
// method's scores per group (keep, healing); the merge pools them per group
// and decides again. A fault score counts against the random row of its own
// run, so the pieces must be of one table, or the merge is refused:
//  - the same model and setting: preset, family, experts, static_only,
//    trainer_seeds, the original's accuracy, and the run options that set
//    the numbers (warm-up, sample seed, faults, fault seeds, run lengths,
//    EMA span: EvalReport::options; the faults compared as a set);
//  - a group in two reports was judged on the same criteria in both;
//  - a method in one group of two reports is the same measurement there
//    (every score equal): `random`, which every run has, measured alike.
// A report from before proxy-eval kept its options is pooled with its
// options unchecked, and a note says so.
#pragma once

#include <cstdint>
#include <optional>
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
  // The run's options (EvalReport::options); nullopt in a report written
  // before proxy-eval kept them, whose options go unchecked, and said.
  std::optional<llvm::json::Object> options;
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
