#include "proxy/ranking_merge.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/json_file.h"
#include "llvm/Support/FormatVariadic.h"
#include "proxy/clustering.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

// The fields that identify a report's table, read by llvm::json's mapper.
bool MapIdentity(const llvm::json::Value& json, RankingPart& part, llvm::json::Path path) {
  llvm::json::ObjectMapper o(json, path);
  return o && o.map("preset", part.preset) && o.map("family", part.family) && o.map("experts", part.experts) &&
         o.map("static_only", part.static_only) && o.map("original_accuracy", part.original_accuracy) &&
         o.mapOptional("trainer_seeds", part.trainer_seeds);
}

bool SameNumber(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// The shortest text that reads back as `v` ("0.3", not 0.29999999999999999).
std::string Shortest(double v) {
  char text[32];
  const std::to_chars_result r = std::to_chars(text, text + sizeof(text), v);
  return std::string(text, r.ptr);
}

// The first score of `a` that differs from `b`'s, as "logit KL 0.06 vs
// 0.07"; empty when they are the same measurement.
std::string ScoreDifference(const MethodScore& a, const MethodScore& b) {
  if (a.fault_score != b.fault_score) return absl::StrFormat("fault score %d vs %d", a.fault_score, b.fault_score);
  if (a.discriminating_cases != b.discriminating_cases || a.response_cases != b.response_cases) {
    return absl::StrFormat("response cases %d of %d vs %d of %d", a.discriminating_cases, a.response_cases,
                           b.discriminating_cases, b.response_cases);
  }
  if (a.dynamics_goal_met != b.dynamics_goal_met) {
    return absl::StrFormat("dynamics goal %d vs %d", a.dynamics_goal_met, b.dynamics_goal_met);
  }
  if (!SameNumber(a.logit_kl, b.logit_kl)) return "logit KL " + Shortest(a.logit_kl) + " vs " + Shortest(b.logit_kl);
  if (!SameNumber(a.accuracy, b.accuracy)) return "accuracy " + Shortest(a.accuracy) + " vs " + Shortest(b.accuracy);
  return "";
}

// `v` as JSON text; "(not recorded)" for none.
std::string OptionText(const llvm::json::Value* v) {
  return v != nullptr ? llvm::formatv("{0}", *v).str() : std::string("(not recorded)");
}

// The first of the run options (EvalReport's "options") that `b` has
// otherwise than `a`, as "--seeds 3 vs 1"; empty when they agree.
std::string OptionsDifference(const llvm::json::Object& a, const llvm::json::Object& b) {
  std::set<std::string> keys;  // both reports' keys, sorted: the same difference named first every time
  for (const llvm::json::Object* o : {&a, &b}) {
    for (const auto& entry : *o) keys.insert(entry.first.str());
  }
  for (const std::string& key : keys) {
    const llvm::json::Value *mine = a.get(key), *other = b.get(key);
    if (mine != nullptr && other != nullptr && *mine == *other) continue;
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    return absl::StrFormat("%s %s vs %s", flag, OptionText(mine), OptionText(other));
  }
  return "";
}

// How `b` differs from `a` in what identifies the table; empty: not at all.
std::string IdentityDifference(const RankingPart& a, const RankingPart& b) {
  if (a.preset != b.preset) return absl::StrFormat("preset %s vs %s", a.preset, b.preset);
  if (a.family != b.family) return absl::StrFormat("family %s vs %s", a.family, b.family);
  if (a.experts != b.experts) return absl::StrFormat("%d experts vs %d", a.experts, b.experts);
  if (a.static_only != b.static_only) {
    return a.static_only ? "static only vs with dynamics" : "with dynamics vs static only";
  }
  if (a.trainer_seeds != b.trainer_seeds) {
    return absl::StrFormat("%d trainer seeds vs %d", a.trainer_seeds, b.trainer_seeds);
  }
  if (a.original_accuracy != b.original_accuracy) {
    return absl::StrFormat("the original's accuracy %s vs %s (another warm-up or sample seed)",
                           Shortest(a.original_accuracy), Shortest(b.original_accuracy));
  }
  return "";
}

// A group pooled from the parts, and the report each of its scores came from.
struct PooledGroup {
  GroupRanking group;
  std::vector<const RankingPart*> from;  // parallel to group.order
};

// Adds `part`'s group `g` to `pool`: a new group, or its methods to the
// group of the same keep and healing. An error where they disagree.
absl::Status Pool(const RankingPart& part, const GroupRanking& g, std::vector<PooledGroup>& pool) {
  PooledGroup* same = nullptr;
  for (PooledGroup& p : pool) {
    if (p.group.keep == g.keep && p.group.heal_steps == g.heal_steps) same = &p;
  }
  if (same == nullptr) {
    pool.push_back({g, std::vector<const RankingPart*>(g.order.size(), &part)});
    return absl::OkStatus();
  }
  const RankingPart& first = *same->from.front();
  if (same->group.faults_judged != g.faults_judged || same->group.dynamics_judged != g.dynamics_judged) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s and %s judged %s on other criteria (faults %s vs %s, dynamics %s vs %s): not one table", first.path,
        part.path, GroupName(g), same->group.faults_judged ? "yes" : "no", g.faults_judged ? "yes" : "no",
        same->group.dynamics_judged ? "yes" : "no", g.dynamics_judged ? "yes" : "no"));
  }
  for (const MethodScore& s : g.order) {
    size_t i = 0;
    while (i < same->group.order.size() && same->group.order[i].method != s.method) ++i;
    if (i == same->group.order.size()) {
      same->group.order.push_back(s);
      same->from.push_back(&part);
      continue;
    }
    if (const std::string diff = ScoreDifference(s, same->group.order[i]); !diff.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s at %s is another measurement in %s than in %s (%s): the runs are not of one table (other seeds or "
          "options?)",
          s.method, GroupName(g), part.path, same->from[i]->path, diff));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankingPart> ReadRankingPart(const std::string& path) {
  MOERR_ASSIGN_OR_RETURN(const llvm::json::Value json, formats::ReadJsonFile(path));
  RankingPart part;
  part.path = path;
  llvm::json::Path::Root root("report");
  if (!MapIdentity(json, part, root)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s is not a proxy-eval --json report: %s", path,
                                                      llvm::toString(root.getError())));
  }
  if (const llvm::json::Value* options = json.getAsObject()->get("options")) {
    if (options->getAsObject() == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: \"options\" is not an object", path));
    }
    part.options = *options->getAsObject();
    // Each fault case runs alone, so the faults are a set, as proxy-eval
    // writes them (sorted, each once): a report that listed them in
    // catalogue order (before they were written so) compares equal.
    if (llvm::json::Array* faults = part.options->getArray("faults")) {
      std::sort(faults->begin(), faults->end(), [](const llvm::json::Value& x, const llvm::json::Value& y) {
        return x.getAsString().getValueOr("") < y.getAsString().getValueOr("");
      });
      const size_t distinct = std::unique(faults->begin(), faults->end()) - faults->begin();
      while (faults->size() > distinct) faults->pop_back();
    }
  }
  const llvm::json::Value* ranking = json.getAsObject()->get("ranking");
  if (ranking == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: the report has no ranking (it has no rows)", path));
  }
  absl::StatusOr<MethodRanking> read = MethodRankingFromJson(*ranking);
  if (!read.ok()) return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, read.status().message()));
  part.ranking = *std::move(read);
  return part;
}

absl::StatusOr<MethodRanking> MergeRankings(const std::vector<RankingPart>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no reports to rank");
  std::vector<PooledGroup> pool;
  MethodRanking out;
  std::vector<std::string> paths, unchecked;
  const RankingPart* with_options = nullptr;  // the first part that recorded its run options
  for (const RankingPart& part : parts) {
    if (const std::string diff = IdentityDifference(parts.front(), part); !diff.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s and %s are not of one table: %s", parts.front().path,
                                                        part.path, diff));
    }
    if (!part.options) {
      unchecked.push_back(part.path);
    } else if (with_options == nullptr) {
      with_options = &part;
    } else if (const std::string diff = OptionsDifference(*with_options->options, *part.options); !diff.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s and %s are not of one table: they ran with %s",
                                                        with_options->path, part.path, diff));
    }
    for (const GroupRanking& g : part.ranking.groups) MOERR_RETURN_IF_ERROR(Pool(part, g, pool));
    for (const std::string& note : part.ranking.notes) {
      if (std::find(out.notes.begin(), out.notes.end(), note) == out.notes.end()) out.notes.push_back(note);
    }
    paths.push_back(part.path);
  }
  for (PooledGroup& p : pool) out.groups.push_back(std::move(p.group));
  out.current_default = MethodName(ClusterOptions{}.method);
  FinishRanking(out);
  out.notes.push_back(absl::StrFormat("pooled from %d reports: %s", parts.size(), absl::StrJoin(paths, ", ")));
  if (!unchecked.empty() && parts.size() > 1) {
    out.notes.push_back(absl::StrFormat(
        "%s: no run options recorded (an earlier proxy-eval): warm-up, sample seed, faults, fault seeds, run lengths "
        "and EMA span not checked against the other reports'",
        absl::StrJoin(unchecked, ", ")));
  }
  return out;
}

llvm::json::Object MergedRankingJson(const std::vector<RankingPart>& parts, const MethodRanking& ranking) {
  llvm::json::Array reports;
  for (const RankingPart& part : parts) reports.push_back(part.path);
  return llvm::json::Object{{"reports", std::move(reports)}, {"ranking", ToJson(ranking)}};
}

}  // namespace moerr::proxy
