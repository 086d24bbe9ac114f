// Which proxy method is best on a proxy-eval table (issue 44, "The default
// is the best method"), by one stated rule, so that the run that makes the
// table also says which method the default should be.
//
// The rule. Rows are compared within a group: the same keep fraction and
// healing (heal_steps). Within a group, methods are ordered by, in turn:
//  1. faults that discriminate (higher first): the fault score counts only
//     what random pruning (the "random" row of the group) does not do as
//     well. A fault case is one catalogue fault at one trainer seed
//     (EvalRow::responses); the method reproduces it when its response and
//     the original's both have an onset, the proxy's not early
//     (ResponseComparison::both_respond). It counts where random's response
//     at the same fault and seed does not reproduce it, or reproduces it
//     worse: a larger onset error or a larger magnitude error than the
//     method's (MeasureResponseError of that one case: |onset difference| in
//     steps, mean |log2| of the response ratios). Replayed reproductions
//     (EvalRow::reproduced, counted per row, not per fault) add only the
//     count above random's. The random row itself scores 0. Skipped, and
//     said, when the group has no random row or the report is static only.
//  2. the dynamics goal (higher first): of reward, KL and grad norm, the
//     metrics whose seed band meets the goal (SeedBandShortfalls empty).
//     Skipped, and said, without dynamics (static only, or fewer than 2
//     trainer seeds).
//  3. the lower logit KL(original || proxy) per token (NaN: last).
//  4. the higher task accuracy.
// A note says when a baseline wins a group: proxy-eval measures the
// baselines unforced, `moerr proxy` forces every method by default.
// The winner of a group is the first in that order; what decided it is the
// first criterion on which it beats the runner-up. Overall: the method that
// wins the most groups; a tie goes to the lower mean logit KL over all of
// its rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"

namespace moerr::proxy {

struct EvalReport;  // proxy_eval.h, which holds its ranking

// One method's standing in one group.
struct MethodScore {
  std::string method;
  int64_t fault_score = 0;         // discriminating fault cases + replayed reproductions above random's
  int64_t discriminating_cases = 0;  // of fault_score: fault-response cases
  int64_t response_cases = 0;      // fault-response cases compared with random's
  int64_t dynamics_goal_met = 0;   // of the 3 judged metrics
  double logit_kl = 0, accuracy = 0;
};

struct GroupRanking {
  double keep = 0;
  int64_t heal_steps = 0;
  bool faults_judged = false;    // a random row in the group and fault responses
  bool dynamics_judged = false;  // seed bands of >= 2 trainer seeds
  std::vector<MethodScore> order;  // best first
  std::string winner;
  std::string reason;  // in words: which criterion decided, the numbers
};

struct MethodRanking {
  std::vector<GroupRanking> groups;  // in the report's order of first appearance
  std::string winner;
  std::string reason;
  std::vector<std::string> notes;  // criteria skipped and why
  std::string current_default;     // the default method (ClusterOptions)
};

// The rule of this header. An error for a report without rows.
absl::StatusOr<MethodRanking> RankMethods(const EvalReport& report);

// The rule's last steps on groups whose scores are set: each group's order,
// winner and reason, then the overall winner and reason (and the note when
// a baseline wins). `ranking` has at least one group, each with a score.
void FinishRanking(MethodRanking& ranking);

// "keep 1/2", "keep 1/4 healed 50".
std::string GroupName(const GroupRanking& group);

// The rule in one line, for a heading.
std::string RankingRuleText();

// One line per group ("keep 1/2: cluster, by ..."), the overall pick and
// whether it is the current default.
std::vector<std::string> RankingLines(const MethodRanking& ranking);

llvm::json::Object ToJson(const MethodRanking& ranking);
// What ToJson wrote, read back (logit KL and accuracy written as null: NaN).
// An error naming the first field that is missing or of another type.
absl::StatusOr<MethodRanking> MethodRankingFromJson(const llvm::json::Value& json);

}  // namespace moerr::proxy
