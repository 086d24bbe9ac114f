#include "world/failure_verdict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/module_path.h"
#include "support/exit_code.h"
#include "support/status.h"

namespace moerr::world {
namespace {

void AddOnce(std::vector<int64_t>& v, int64_t x) {
  if (x >= 0 && std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

// A recording's replay: rank r's shard and experts are on replay rank r / k;
// an expert on the rank of the replay's EP group that hosts it.
std::vector<int64_t> ReplayRanksOf(const replayer::WorldReplayPlan& plan, const replayer::RankFailure& f) {
  std::vector<int64_t> out;
  const int64_t m = f.rank / plan.covers();
  AddOnce(out, m);
  for (const std::string& module : f.failure.modules) {
    const auto e = formats::ExpertOf(module);
    if (!e || plan.experts <= 0) continue;
    AddOnce(out, m / plan.ep_size * plan.ep_size + e->second / (plan.experts / plan.ep_size));
  }
  return out;
}

// A proxy run: the proxy rank training on r's shard (none when the proxy
// kept other shards), and the one hosting an expert the failure is in.
std::vector<int64_t> ProxyRanksOf(const llvm::json::Object& proxy, int64_t ranks, const replayer::RankFailure& f) {
  std::vector<int64_t> out;
  const int64_t original = proxy.getInteger("original_ranks").getValueOr(ranks);
  if (const llvm::json::Array* shards = proxy.getArray("batch_of_ranks")) {
    for (size_t m = 0; m < shards->size(); ++m) {
      if ((*shards)[m].getAsInteger() == f.rank) AddOnce(out, static_cast<int64_t>(m));
    }
  } else if (original >= ranks) {  // "all": proxy rank m trains on ranks [m*N/M, (m+1)*N/M)
    AddOnce(out, f.rank / (original / ranks));
  }
  if (out.empty()) return out;  // its tokens are not in the proxy
  for (const std::string& module : f.failure.modules) {
    if (const auto e = formats::ExpertOf(module)) AddOnce(out, ProxyRankOf(proxy, e->first, e->second).value_or(-1));
  }
  return out;
}

const char* LevelName(const FailureRow& r) {
  if (r.looked_at.empty()) return "not in the proxy (its shard was not kept)";
  if (r.shown.level == replayer::Reproduction::kNo) return "NOT REPRODUCED";
  if (!r.discriminating) return "NOT DISCRIMINATING (the healthy ranks warn of it as much)";
  if (r.shown.localised) return "reproduced, localised";
  return "reproduced, not localised";
}

// The fault's rank alone is judged (a lint check's failure; an overflow is
// placed by causal order already); the others that warned of the same rule
// set the bar the finding must pass.
void KeepFaultRank(replayer::WorldFailure& recorded, FailureVerdict& v) {
  if (!v.fault || v.fault->rank < 0 || recorded.kind.empty() || recorded.kind == "overflow") return;
  std::vector<replayer::RankFailure> kept;
  for (replayer::RankFailure& f : recorded.ranks) {
    if (f.rank == v.fault->rank) kept.push_back(std::move(f));
  }
  for (const replayer::RankFailure& f : recorded.ranks) {
    if (f.rank == v.fault->rank || f.failure.kind.empty() || kept.empty()) continue;
    if (f.failure.rule != kept[0].failure.rule) continue;
    v.healthy_ranks.push_back(f.rank);
    const double m = f.failure.measure.value_or(std::numeric_limits<double>::infinity());
    v.healthy_bar = std::max(v.healthy_bar.value_or(-std::numeric_limits<double>::infinity()), m);
  }
  recorded.ranks = std::move(kept);
}

bool StandsOut(const std::optional<double>& bar, const replayer::Failure& f) {
  return !bar || (f.measure && *f.measure > *bar);
}

// Where a shown failure is, and in a proxy the original expert behind it.
std::string ShownText(const FailureRow& r, const std::optional<llvm::json::Object>& proxy) {
  if (!r.shown.failure) return "";
  std::string where = r.shown.failure->modules.empty() ? r.shown.failure->module_class : r.shown.failure->modules[0];
  if (proxy) {
    if (const auto original = OriginalOf(*proxy, where)) {
      where += absl::StrFormat(" (the original's expert %d, hosted by rank %d)", original->expert, original->rank);
    }
  }
  const std::string& phase = r.shown.failure->phase;
  return absl::StrFormat(": %s in %s%s", r.shown.failure->kind, where, phase.empty() ? "" : " (" + phase + ")");
}

}  // namespace

int64_t FailureVerdict::judged() const {
  int64_t n = 0;
  for (const FailureRow& r : rows) n += r.looked_at.empty() ? 0 : 1;
  return n;
}

bool FailureVerdict::reproduced() const {
  bool ok = judged() > 0;
  for (const FailureRow& r : rows) ok = ok && (r.looked_at.empty() || r.reproduced());
  return ok;
}

bool FailureVerdict::localised() const {
  bool ok = reproduced();
  for (const FailureRow& r : rows) ok = ok && (r.looked_at.empty() || r.shown.localised);
  return ok;
}

bool FailureVerdict::discriminating() const {
  bool ok = true;
  for (const FailureRow& r : rows) ok = ok && (r.looked_at.empty() || r.discriminating);
  return ok;
}

absl::StatusOr<std::optional<FailureVerdict>> JudgeFailure(const WorldReplayComparison& c) {
  FailureVerdict v;
  replayer::WorldFailure recorded;
  replayer::SameModule same = [](const std::string& a, const std::string& b) { return a == b; };
  if (c.proxy) {
    const llvm::json::Object* failures = c.proxy->getObject("failures");
    if (failures == nullptr) return std::optional<FailureVerdict>();
    MOERR_ASSIGN_OR_RETURN(recorded, replayer::WorldFailureFromJson(*failures));
    if (const llvm::json::Object* fault = c.proxy->getObject("fault")) {
      if (auto kind = moe::ParseFault(fault->getString("kind").getValueOr("").str()); kind.ok()) {
        v.fault = replayer::RecordedFault{*kind, fault->getInteger("rank").getValueOr(-1)};
      }
    }
    const llvm::json::Object& proxy = *c.proxy;
    same = [&proxy](const std::string& a, const std::string& b) { return StandsFor(proxy, a, b); };
  } else {
    MOERR_ASSIGN_OR_RETURN(recorded,
                           replayer::FindWorldFailure(c.recorded_run, replayer::FailureKindOfRun(c.recorded_run)));
    v.fault = replayer::FaultOfRun(c.recorded_run);
  }
  v.kind = recorded.kind;
  KeepFaultRank(recorded, v);
  // Each replay rank's failures of a kind, read once (a lint pass each).
  std::map<std::pair<int64_t, std::string>, std::vector<replayer::Failure>> failures_of;
  for (replayer::RankFailure& f : recorded.ranks) {
    FailureRow row;
    row.looked_at = c.proxy ? ProxyRanksOf(*c.proxy, c.plan.ranks, f) : ReplayRanksOf(c.plan, f);
    row.recorded = std::move(f);
    for (int64_t m : row.looked_at) {
      if (m >= static_cast<int64_t>(c.replayed_run.ranks.size())) continue;
      const formats::RankStep& rank = c.replayed_run.ranks[static_cast<size_t>(m)];
      auto [it, fresh] = failures_of.try_emplace({m, row.recorded.failure.kind});
      if (fresh) {
        if (!rank.reader || !rank.trace) {
          return absl::FailedPreconditionError(absl::StrFormat("replay rank %d: step %d cannot be read", m, c.step));
        }
        MOERR_ASSIGN_OR_RETURN(it->second,
                               replayer::FailuresOf(*rank.reader, c.step, *rank.trace, row.recorded.failure.kind));
      }
      replayer::Shown shown = replayer::ShowFailure(it->second, row.recorded.failure, same);
      if (row.shown_rank < 0 ||
          std::make_pair(shown.localised, shown.level) > std::make_pair(row.shown.localised, row.shown.level)) {
        row.shown = std::move(shown);
        row.shown_rank = m;
      }
    }
    row.discriminating = StandsOut(v.healthy_bar, row.recorded.failure) &&
                         (!row.shown.failure || StandsOut(v.healthy_bar, *row.shown.failure));
    v.rows.push_back(std::move(row));
  }
  return std::optional<FailureVerdict>(std::move(v));
}

void PrintFailureVerdict(const FailureVerdict& v, const WorldReplayComparison& c) {
  const bool proxy = c.proxy.has_value();
  const std::string kind = v.kind.empty() ? "the world's first overflow, else each rank's worst warning" : v.kind;
  std::string fault;
  if (v.fault) {
    fault = absl::StrFormat(", the run's fault %s%s", moe::FaultName(v.fault->kind),
                            v.fault->rank >= 0 ? absl::StrFormat(" on rank %d", v.fault->rank) : " on every rank");
  }
  std::printf("  failure (%s%s): %s\n", kind.c_str(), fault.c_str(),
              v.rows.empty() ? "none recorded" : absl::StrFormat("%d rank(s) show it", v.rows.size()).c_str());
  const char* who = proxy ? "original rank" : "recorded rank";
  const char* where = proxy ? "proxy rank" : "replay rank";
  std::vector<int64_t> absent;  // original ranks whose shards the proxy did not keep: one line
  for (const FailureRow& r : v.rows) {
    if (r.looked_at.empty()) {
      absent.push_back(r.recorded.rank);
      continue;
    }
    std::string ranks;
    for (int64_t m : r.looked_at) ranks += (ranks.empty() ? "" : ",") + std::to_string(m);
    std::printf("    %s %lld: %s\n      -> %s %s: %s%s\n", who, static_cast<long long>(r.recorded.rank),
                r.recorded.failure.description.c_str(), where, ranks.empty() ? "-" : ranks.c_str(), LevelName(r),
                ShownText(r, c.proxy).c_str());
  }
  if (!absent.empty()) {
    std::printf("    %s(s) %s: not in the proxy (their shards were not kept)\n", who, absl::StrJoin(absent, ", ").c_str());
  }
  if (!v.healthy_ranks.empty()) {
    std::printf("    healthy rank(s) %s warn of it too (largest %s); only the fault's rank is judged\n",
                absl::StrJoin(v.healthy_ranks, ", ").c_str(),
                std::isfinite(*v.healthy_bar) ? absl::StrFormat("%.3f", *v.healthy_bar).c_str() : "unmeasured");
  }
  if (v.rows.empty()) return;
  if (v.kind.empty()) {
    std::printf("  (the run names no fault: each rank's worst warning is shown, not judged)\n");
    return;
  }
  if (!v.discriminating()) {
    std::printf("  the finding does not stand out from the healthy ranks': NOT DISCRIMINATING, not reproduced\n");
    return;
  }
  std::printf("  %s\n", !v.reproduced()  ? "the failure is NOT REPRODUCED"
                        : v.localised() ? "the failure reproduces and is localised on every rank that shows it"
                                        : "the failure reproduces, NOT LOCALISED everywhere");
}

int FailureExitCode(const FailureVerdict& v, bool proxy) {
  // Each rank's own worst warning (a run that names no fault) is shown, not
  // judged: an overflow is judged by the first overflow already.
  if (v.rows.empty() || v.kind.empty()) return kExitOk;
  return proxy || !v.reproduced() ? kExitFinding : kExitOk;
}

llvm::json::Object FailureVerdictJson(const FailureVerdict& v, const WorldReplayComparison& c) {
  llvm::json::Array rows;
  for (const FailureRow& r : v.rows) {
    llvm::json::Object row{{"rank", r.recorded.rank},
                           {"kind", r.recorded.failure.kind},
                           {"phase", r.recorded.failure.phase},
                           {"modules", llvm::json::Array(r.recorded.failure.modules)},
                           {"description", r.recorded.failure.description},
                           {"looked_at", llvm::json::Array(r.looked_at)},
                           {"rule", r.recorded.failure.rule},
                           {"reproduced", r.reproduced()},
                           {"discriminating", r.discriminating},
                           {"localised", r.reproduced() && r.shown.localised}};
    if (r.recorded.failure.measure) row["measure"] = *r.recorded.failure.measure;
    if (r.shown.failure) {
      const std::string module = r.shown.failure->modules.empty() ? "" : r.shown.failure->modules[0];
      llvm::json::Object shown{{"rank", r.shown_rank}, {"module", module}, {"description", r.shown.failure->description}};
      if (r.shown.failure->measure) shown["measure"] = *r.shown.failure->measure;
      if (const auto original = c.proxy ? OriginalOf(*c.proxy, module) : std::nullopt) {
        shown["original_expert"] = original->expert;
        shown["original_rank"] = original->rank;
      }
      row["shown"] = std::move(shown);
    }
    rows.push_back(std::move(row));
  }
  // A run that names no fault: its ranks' warnings are shown, not judged.
  const auto judged = [&v](bool b) { return v.kind.empty() ? llvm::json::Value(nullptr) : llvm::json::Value(b); };
  llvm::json::Object out{{"kind", v.kind},
                         {"ranks", std::move(rows)},
                         {"judged", v.judged()},
                         {"reproduced", judged(v.reproduced())},
                         {"localised", judged(v.localised())},
                         {"discriminating", judged(v.discriminating())},
                         {"healthy_ranks", llvm::json::Array(v.healthy_ranks)}};
  if (v.healthy_bar && std::isfinite(*v.healthy_bar)) out["healthy_measure"] = *v.healthy_bar;
  if (v.fault) out["fault"] = replayer::FaultAnnotation(v.fault->kind, v.fault->rank);
  return out;
}

}  // namespace moerr::world
