#include "proxy/method_ranking.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_format.h"
#include "formats/json_number.h"
#include "proxy/clustering.h"
#include "proxy/proxy_eval.h"
#include "proxy/response_error.h"
#include "proxy/seed_band.h"
#include "proxy/seed_dynamics.h"
#include "support/check.h"

namespace moerr::proxy {
namespace {

constexpr const char* kRandomMethod = "random";

// "1/2" for 0.5; otherwise the fraction as a decimal.
std::string KeepText(double keep) {
  const double inverse = keep > 0 ? 1 / keep : 0;
  if (inverse >= 1 && std::abs(inverse - std::round(inverse)) < 1e-9) {
    return absl::StrFormat("1/%d", static_cast<int64_t>(std::round(inverse)));
  }
  return absl::StrFormat("%g", keep);
}

// The method's response to one fault case reproduces the original's.
bool Reproduces(const FaultResponseRow& r) { return r.comparison.both_respond; }

ResponseError CaseError(const FaultResponseRow& r) { return MeasureResponseError({{r.original, r.proxy, r.end}}); }

// `row`'s fault case `r` counts: random's response to the same fault at the
// same seed does not reproduce it, or has a larger onset or magnitude error.
bool Discriminates(const FaultResponseRow& r, const EvalRow& random) {
  if (!Reproduces(r)) return false;
  for (const FaultResponseRow& q : random.responses) {
    if (q.fault != r.fault || q.seed != r.seed) continue;
    if (!Reproduces(q)) return true;
    const ResponseError mine = CaseError(r), theirs = CaseError(q);
    return theirs.onset > mine.onset || theirs.magnitude > mine.magnitude;
  }
  return true;  // random has no response to this case: it does not reproduce it
}

MethodScore Score(const EvalRow& row, const EvalRow* random, bool faults, bool dynamics) {
  MethodScore s{row.method};
  s.logit_kl = row.logit_kl;
  s.accuracy = row.accuracy;
  if (faults && row.method != kRandomMethod) {
    for (const FaultResponseRow& r : row.responses) {
      s.discriminating_cases += Discriminates(r, *random);
    }
    s.response_cases = static_cast<int64_t>(row.responses.size());
    s.fault_score = s.discriminating_cases + std::max<int64_t>(0, row.reproduced - random->reproduced);
  }
  if (dynamics) s.dynamics_goal_met = SeedGoalMetricsMet(row.seed_band);
  return s;
}

double KlKey(double kl) { return std::isnan(kl) ? std::numeric_limits<double>::infinity() : kl; }

// < 0: a before b on criterion `c` (0 faults, 1 dynamics, 2 KL, 3 accuracy).
int CompareOn(int c, const MethodScore& a, const MethodScore& b) {
  switch (c) {
    case 0: return a.fault_score == b.fault_score ? 0 : (a.fault_score > b.fault_score ? -1 : 1);
    case 1: return a.dynamics_goal_met == b.dynamics_goal_met ? 0 : (a.dynamics_goal_met > b.dynamics_goal_met ? -1 : 1);
    case 2: return KlKey(a.logit_kl) == KlKey(b.logit_kl) ? 0 : (KlKey(a.logit_kl) < KlKey(b.logit_kl) ? -1 : 1);
    default: {
      const double x = std::isnan(a.accuracy) ? -1 : a.accuracy, y = std::isnan(b.accuracy) ? -1 : b.accuracy;
      return x == y ? 0 : (x > y ? -1 : 1);
    }
  }
}

// The measure of criterion `c` of `s`, as the reason quotes it.
std::string Measure(int c, const MethodScore& s) {
  switch (c) {
    case 0:
      if (s.method == kRandomMethod) return "0 (the baseline)";
      return absl::StrFormat("%d (%d of %d response cases)", s.fault_score, s.discriminating_cases,
                             s.response_cases);
    case 1: return absl::StrFormat("%d of 3 metrics", s.dynamics_goal_met);
    case 2: return absl::StrFormat("%.4g", s.logit_kl);
    default: return absl::StrFormat("%.3f", s.accuracy);
  }
}

constexpr const char* kCriterionName[] = {"faults that discriminate", "dynamics goal", "logit KL", "accuracy"};

// Orders g.order by the criteria that apply and names the deciding one.
void Decide(GroupRanking& g) {
  std::vector<int> criteria;
  if (g.faults_judged) criteria.push_back(0);
  if (g.dynamics_judged) criteria.push_back(1);
  criteria.push_back(2);
  criteria.push_back(3);
  std::stable_sort(g.order.begin(), g.order.end(), [&criteria](const MethodScore& a, const MethodScore& b) {
    for (int c : criteria) {
      if (const int cmp = CompareOn(c, a, b); cmp != 0) return cmp < 0;
    }
    return false;
  });
  g.winner = g.order.front().method;
  if (g.order.size() == 1) {
    g.reason = "the only method";
    return;
  }
  const MethodScore &best = g.order[0], &next = g.order[1];
  for (int c : criteria) {
    if (CompareOn(c, best, next) == 0) continue;
    g.reason = absl::StrFormat("by %s: %s vs %s's %s", kCriterionName[c], Measure(c, best), next.method,
                               Measure(c, next));
    return;
  }
  g.reason = absl::StrFormat("tied with %s on every criterion; first in the report's order", next.method);
}

constexpr const char* kBaselineNote =
    "a baseline that wins was measured unforced (proxy-eval forces only cluster and cluster-frequency), while "
    "`moerr proxy --method M` forces by default: its proxy there is not the one ranked here";

}  // namespace

std::string GroupName(const GroupRanking& g) {
  std::string name = "keep " + KeepText(g.keep);
  if (g.heal_steps > 0) name += absl::StrFormat(" healed %d", g.heal_steps);
  return name;
}

void FinishRanking(MethodRanking& out) {
  MOERR_CHECK(!out.groups.empty());
  for (const GroupRanking& g : out.groups) MOERR_CHECK(!g.order.empty());
  std::map<std::string, int64_t> wins;
  std::map<std::string, std::pair<double, int64_t>> kl_sum;  // over the method's rows, one per group
  bool baseline_wins = false;
  for (GroupRanking& g : out.groups) {
    Decide(g);
    ++wins[g.winner];
    // Configure (proxy_eval.cpp) forces only cluster and cluster-frequency.
    baseline_wins |= g.winner != "cluster" && g.winner != "cluster-frequency" && g.winner != "cluster-unforced";
    for (const MethodScore& s : g.order) {
      auto& [sum, n] = kl_sum[s.method];
      sum += KlKey(s.logit_kl);
      ++n;
    }
  }
  // Said once, and only when it holds (a merge decides again).
  out.notes.erase(std::remove(out.notes.begin(), out.notes.end(), kBaselineNote), out.notes.end());
  if (baseline_wins) out.notes.push_back(kBaselineNote);
  // Overall: most groups won; a tie goes to the lower mean logit KL.
  auto mean_kl = [&kl_sum](const std::string& m) { return kl_sum[m].first / kl_sum[m].second; };
  std::vector<std::pair<std::string, int64_t>> standing(wins.begin(), wins.end());
  std::stable_sort(standing.begin(), standing.end(), [&mean_kl](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return mean_kl(a.first) < mean_kl(b.first);
  });
  out.winner = standing.front().first;
  const int64_t groups = static_cast<int64_t>(out.groups.size());
  if (standing.size() > 1 && standing[1].second == standing[0].second) {
    out.reason = absl::StrFormat("wins %d of %d keep(s), as many as %s; the lower mean logit KL: %.4g vs %.4g",
                                 standing[0].second, groups, standing[1].first, mean_kl(out.winner),
                                 mean_kl(standing[1].first));
  } else {
    out.reason = absl::StrFormat("wins %d of %d keep(s)", standing[0].second, groups);
  }
}

std::string RankingRuleText() {
  return "faults that discriminate (against random pruning), then the dynamics goal, then logit KL, then accuracy";
}

absl::StatusOr<MethodRanking> RankMethods(const EvalReport& report) {
  if (report.rows.empty()) return absl::InvalidArgumentError("method ranking: the report has no rows");
  MethodRanking out;
  out.current_default = MethodName(ClusterOptions{}.method);
  const bool dynamics = !report.options.static_only && report.options.trainer_seeds >= 2;
  std::vector<std::pair<double, int64_t>> keys;  // (keep, heal_steps) in order of first appearance
  for (const EvalRow& row : report.rows) {
    if (std::find(keys.begin(), keys.end(), std::make_pair(row.keep, row.heal_steps)) == keys.end()) {
      keys.emplace_back(row.keep, row.heal_steps);
    }
  }
  bool any_without_random = false;
  for (const auto& key : keys) {
    GroupRanking g;
    g.keep = key.first;
    g.heal_steps = key.second;
    const EvalRow* random = nullptr;
    for (const EvalRow& row : report.rows) {
      if (row.keep == g.keep && row.heal_steps == g.heal_steps && row.method == kRandomMethod) random = &row;
    }
    g.faults_judged = !report.options.static_only && random != nullptr;
    any_without_random |= !report.options.static_only && random == nullptr;
    g.dynamics_judged = dynamics;
    for (const EvalRow& row : report.rows) {
      if (row.keep == g.keep && row.heal_steps == g.heal_steps) {
        g.order.push_back(Score(row, random, g.faults_judged, g.dynamics_judged));
      }
    }
    out.groups.push_back(std::move(g));
  }
  if (report.options.static_only) {
    out.notes.push_back("static only: ranked by logit KL, then accuracy (no faults, no dynamics)");
  } else {
    if (any_without_random) {
      out.notes.push_back("no random row at some keep: the fault criterion is skipped there");
    }
    if (!dynamics) out.notes.push_back("fewer than 2 trainer seeds: no dynamics goal");
  }
  FinishRanking(out);
  return out;
}

std::vector<std::string> RankingLines(const MethodRanking& ranking) {
  std::vector<std::string> lines;
  for (const GroupRanking& g : ranking.groups) {
    lines.push_back(absl::StrFormat("  %s: %s, %s", GroupName(g), g.winner, g.reason));
  }
  for (const std::string& note : ranking.notes) lines.push_back("  (" + note + ")");
  lines.push_back(absl::StrFormat("  overall: %s, %s; %s", ranking.winner, ranking.reason,
                                  ranking.winner == ranking.current_default
                                      ? "it is the current default"
                                      : "the current default is " + ranking.current_default));
  return lines;
}

llvm::json::Object ToJson(const MethodRanking& ranking) {
  llvm::json::Array groups;
  for (const GroupRanking& g : ranking.groups) {
    llvm::json::Array order;
    for (const MethodScore& s : g.order) {
      order.push_back(llvm::json::Object{{"method", s.method},
                                         {"fault_score", s.fault_score},
                                         {"discriminating_cases", s.discriminating_cases},
                                         {"response_cases", s.response_cases},
                                         {"dynamics_goal_met", s.dynamics_goal_met},
                                         {"logit_kl", formats::JsonNumber(s.logit_kl)},
                                         {"accuracy", formats::JsonNumber(s.accuracy)}});
    }
    groups.push_back(llvm::json::Object{{"keep", g.keep},
                                        {"heal_steps", g.heal_steps},
                                        {"faults_judged", g.faults_judged},
                                        {"dynamics_judged", g.dynamics_judged},
                                        {"order", std::move(order)},
                                        {"winner", g.winner},
                                        {"reason", g.reason}});
  }
  llvm::json::Array notes;
  for (const std::string& n : ranking.notes) notes.push_back(n);
  return llvm::json::Object{{"rule", RankingRuleText()},     {"groups", std::move(groups)},
                            {"winner", ranking.winner},       {"reason", ranking.reason},
                            {"notes", std::move(notes)},      {"current_default", ranking.current_default},
                            {"is_default", ranking.winner == ranking.current_default}};
}

namespace {

// A number ToJson wrote with formats::JsonNumber: null for NaN. `json` is
// an object (its ObjectMapper said so); the key must be there.
bool MapNumber(const llvm::json::Value& json, llvm::json::Path path, llvm::StringLiteral key, double& out) {
  const llvm::json::Value* v = json.getAsObject()->get(key);
  if (v == nullptr) {
    path.field(key).report("missing value");
    return false;
  }
  if (v->kind() == llvm::json::Value::Null) {
    out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return fromJSON(*v, out, path.field(key));
}

}  // namespace

// The readers of MethodRankingFromJson, found by llvm::json's ObjectMapper.
bool fromJSON(const llvm::json::Value& json, MethodScore& s, llvm::json::Path path) {
  llvm::json::ObjectMapper o(json, path);
  return o && o.map("method", s.method) && o.map("fault_score", s.fault_score) &&
         o.map("discriminating_cases", s.discriminating_cases) && o.map("response_cases", s.response_cases) &&
         o.map("dynamics_goal_met", s.dynamics_goal_met) && MapNumber(json, path, "logit_kl", s.logit_kl) &&
         MapNumber(json, path, "accuracy", s.accuracy);
}

bool fromJSON(const llvm::json::Value& json, GroupRanking& g, llvm::json::Path path) {
  llvm::json::ObjectMapper o(json, path);
  return o && o.map("keep", g.keep) && o.map("heal_steps", g.heal_steps) && o.map("faults_judged", g.faults_judged) &&
         o.map("dynamics_judged", g.dynamics_judged) && o.map("order", g.order) && o.map("winner", g.winner) &&
         o.map("reason", g.reason);
}

bool fromJSON(const llvm::json::Value& json, MethodRanking& r, llvm::json::Path path) {
  llvm::json::ObjectMapper o(json, path);
  return o && o.map("groups", r.groups) && o.map("winner", r.winner) && o.map("reason", r.reason) &&
         o.map("notes", r.notes) && o.map("current_default", r.current_default);
}

absl::StatusOr<MethodRanking> MethodRankingFromJson(const llvm::json::Value& json) {
  MethodRanking out;
  llvm::json::Path::Root root("ranking");
  if (!fromJSON(json, out, root)) return absl::InvalidArgumentError(llvm::toString(root.getError()));
  if (out.groups.empty()) return absl::InvalidArgumentError("ranking: no groups");
  for (const GroupRanking& g : out.groups) {
    if (g.order.empty()) return absl::InvalidArgumentError("ranking: a group without methods");
  }
  return out;
}

}  // namespace moerr::proxy
