#include "world/world_replay_comparison.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "diff/world_diff.h"
#include "formats/annotations.h"
#include "formats/json_number.h"
#include "formats/module_path.h"
#include "formats/world_manifest.h"
#include "support/exit_code.h"
#include "support/status.h"

namespace moerr::world {
namespace {

ReplayedPart Summarize(const diff::WorldDiffPart& p) {
  ReplayedPart s;
  s.what = p.what;
  s.recorded_rank = p.rank_a;
  s.replay_rank = p.rank_b;
  s.unmatched = p.report.only_a + p.report.only_b;
  for (const diff::OpDiff& op : p.report.ops) {
    if (op.a < 0 || op.b < 0) continue;
    ++s.ops;
    bool bitwise = true;
    for (const diff::OutputDiff& o : op.outputs) bitwise = bitwise && o.fingerprints.bitwise_equal;
    s.bitwise += bitwise ? 1 : 0;
    s.diverged += op.diverged ? 1 : 0;
    if (op.error > s.max_error) {
      s.max_error = op.error;
      const formats::OpEvent& e = p.a.ops[static_cast<size_t>(op.a)];
      s.worst = absl::StrFormat("%s (%s, %s)", e.name, e.module, formats::PhaseName(e.phase));
    }
  }
  return s;
}

// Each rank's CPU seconds in the replayed step (its "replay_time"
// annotation); a rank without it is an error naming the rank, not a 0.
absl::StatusOr<std::vector<double>> RankCpuSeconds(const formats::WorldStep& w) {
  std::vector<double> out;
  for (const formats::RankStep& r : w.ranks) {
    const std::string bundle = absl::StrFormat("%s, rank %d", w.dir, r.rank);
    if (!r.reader) return absl::DataLossError(absl::StrFormat("%s: no bundle: %s", bundle, r.error.message()));
    const absl::StatusOr<formats::ReplayTime> t = formats::ReadReplayTime(*r.reader, w.step, bundle);
    if (!t.ok()) return absl::DataLossError(t.status().message());
    out.push_back(t->cpu_seconds);
  }
  return out;
}

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

llvm::json::Object Metrics(const formats::WorldStep& w) {
  const formats::RankStep& r = w.ranks[0];
  if (!r.reader) return {};
  absl::StatusOr<llvm::json::Object> m =
      formats::ReadObjectAnnotation(*r.reader, formats::kMetricsAnnotation, w.step, w.dir);
  return m.ok() ? *std::move(m) : llvm::json::Object{};
}

// ---- A proxy's experts -------------------------------------------------

bool ProxyReproduced(const WorldReplayComparison& c) {
  const llvm::json::Object* failure = c.proxy->getObject("failure");
  if (failure == nullptr) return !c.replayed;
  if (!c.replayed) return false;
  const formats::OpEvent& op = *c.replayed->cause.first.op;
  if (std::string(formats::PhaseName(op.phase)) != failure->getString("phase").getValueOr("").str() ||
      formats::ModuleClass(op.module) != formats::ModuleClass(failure->getString("module").getValueOr("").str())) {
    return false;
  }
  const auto failed = failure->getInteger("expert");
  // Outside an expert, the same layer too (a module class drops the index).
  if (!failed) {
    return formats::ParseModulePath(op.module).layer ==
           formats::ParseModulePath(failure->getString("module").getValueOr("").str()).layer;
  }
  const auto here = formats::ExpertOf(op.module);
  if (!here || here->first != failure->getInteger("layer")) return false;
  const auto original = formats::ProxyKeptExpert(*c.proxy, here->first, here->second);
  return original && (*original == *failed || formats::ProxyMapsTo(*c.proxy, here->first, *failed) == *original);
}

// ---- Text ---------------------------------------------------------------

// A metric of the step as text: a number, "nan"/"inf" as MetricsToJson writes them, or "-".
std::string MetricText(const llvm::json::Object& m, const char* name) {
  const llvm::json::Value* v = m.get(name);
  if (v == nullptr) return "-";
  if (auto n = v->getAsNumber()) return absl::StrFormat("%.9g", *n);
  if (auto s = v->getAsString()) return s->str();
  return "-";
}

// ", expert 3 of layer 0" and, in a proxy, " (the original's expert 9, hosted by rank 2)".
std::string ExpertText(const std::string& module, const std::optional<llvm::json::Object>& proxy) {
  const auto expert = formats::ExpertOf(module);
  if (!expert) return "";
  std::string text = absl::StrFormat(", expert %d of layer %d", expert->second, expert->first);
  if (const auto original = proxy ? OriginalOf(*proxy, module) : std::nullopt) {
    text += absl::StrFormat(" (the original's expert %d, hosted by rank %d)", original->expert, original->rank);
  }
  return text;
}

std::string OverflowText(const std::optional<analysis::WorldOverflow>& w,
                         const std::optional<llvm::json::Object>& proxy) {
  if (!w) return "none";
  const analysis::FirstOverflow& f = w->cause.first;
  return absl::StrFormat("rank %d, op %d %s (%s, %s)%s", w->rank, f.op_index, f.op->name, f.op->module,
                         formats::PhaseName(f.op->phase), ExpertText(f.op->module, proxy));
}

std::string FailureText(const llvm::json::Object& proxy) {
  const llvm::json::Object* f = proxy.getObject("failure");
  if (f == nullptr) return "none";
  return absl::StrFormat("rank %d, %s (%s, %s)", f->getInteger("rank").getValueOr(-1),
                         f->getString("op").getValueOr("").str(), f->getString("module").getValueOr("").str(),
                         f->getString("phase").getValueOr("").str());
}

const char* const kMetrics[] = {"loss", "grad_norm", "reward", "kl"};
// The metrics are world totals summed in another order on fewer ranks: equal
// to fp32 rounding (docs/DISTRIBUTED.md, "Same numbers, and the tolerance").
constexpr double kMetricTolerance = 1e-5;

// One line per recorded rank (its experts' parts added up: the experts it
// hosted and where they are now), or per part when the parts are ranks.
void PrintParts(const WorldReplayComparison& c) {
  std::vector<ReplayedPart> lines;
  for (const ReplayedPart& p : c.parts) {
    const bool expert = p.what.rfind("expert ", 0) == 0;
    if (!expert || lines.empty() || lines.back().recorded_rank != p.recorded_rank ||
        lines.back().replay_rank != p.replay_rank) {
      lines.push_back(p);
      if (expert) lines.back().what = "experts " + p.what.substr(7);
      continue;
    }
    ReplayedPart& l = lines.back();
    l.what = l.what.substr(0, l.what.find('-')) + "-" + p.what.substr(7);
    l.ops += p.ops, l.bitwise += p.bitwise, l.diverged += p.diverged, l.unmatched += p.unmatched;
    if (p.max_error > l.max_error) l.max_error = p.max_error, l.worst = p.worst;
  }
  size_t ops = 0, bitwise = 0, diverged = 0;
  const ReplayedPart* worst = nullptr;
  for (const ReplayedPart& p : lines) {
    std::printf("  rank %lld -> %lld, %-12s %5zu ops, %5zu bitwise, %zu diverged%s, max error %.3g\n",
                static_cast<long long>(p.recorded_rank), static_cast<long long>(p.replay_rank), (p.what + ":").c_str(),
                p.ops, p.bitwise, p.diverged, p.unmatched ? absl::StrFormat(", %d unmatched", p.unmatched).c_str() : "",
                p.max_error);
    ops += p.ops, bitwise += p.bitwise, diverged += p.diverged;
    if (worst == nullptr || p.max_error > worst->max_error) worst = &p;
  }
  std::printf("  expert ops compared: %zu, bitwise %zu, within tolerance %zu, diverged %zu", ops, bitwise,
              ops - bitwise - diverged, diverged);
  if (worst != nullptr && worst->max_error > 0) {
    std::printf("; largest deviation %.3g at %s, %s", worst->max_error, worst->what.c_str(), worst->worst.c_str());
  }
  std::printf("\n");
  for (const diff::DenseDiff& d : c.dense) {
    std::printf(
        "  ranks %lld-%lld -> %lld, dense ops: %zu outputs against the ranks' combined fingerprints, %zu "
        "diverged, max error %.3g%s; %zu without a counterpart (sums over the ranks' rows), %zu unaligned\n",
        static_cast<long long>(d.first_rank), static_cast<long long>(d.first_rank + d.ranks - 1),
        static_cast<long long>(d.replay_rank), d.outputs, d.diverged, d.max_error,
        d.max_error > 0 ? (" at " + d.worst).c_str() : "", d.without_counterpart, d.unaligned);
  }
}

// ---- JSON ---------------------------------------------------------------

llvm::json::Value OverflowJson(const std::optional<analysis::WorldOverflow>& w,
                               const std::optional<llvm::json::Object>& proxy) {
  if (!w) return nullptr;
  llvm::json::Object o = analysis::OverflowPlaceJson(*w);
  if (const auto original = proxy ? OriginalOf(*proxy, w->cause.first.op->module) : std::nullopt) {
    o["original_expert"] = original->expert;
    o["original_rank"] = original->rank;
  }
  return o;
}

llvm::json::Array PartsJson(const WorldReplayComparison& c) {
  llvm::json::Array parts;
  for (const ReplayedPart& p : c.parts) {
    parts.push_back(llvm::json::Object{{"part", p.what},
                                       {"recorded_rank", p.recorded_rank},
                                       {"replay_rank", p.replay_rank},
                                       {"ops", static_cast<int64_t>(p.ops)},
                                       {"bitwise", static_cast<int64_t>(p.bitwise)},
                                       {"diverged", static_cast<int64_t>(p.diverged)},
                                       {"unmatched", static_cast<int64_t>(p.unmatched)},
                                       {"max_error", formats::JsonNumber(p.max_error)},
                                       {"worst_op", p.worst}});
  }
  return parts;
}

llvm::json::Array DenseJson(const WorldReplayComparison& c) {
  llvm::json::Array out;
  for (const diff::DenseDiff& d : c.dense) {
    out.push_back(llvm::json::Object{{"replay_rank", d.replay_rank},
                                     {"recorded_ranks", llvm::json::Array{d.first_rank, d.first_rank + d.ranks - 1}},
                                     {"outputs", static_cast<int64_t>(d.outputs)},
                                     {"diverged", static_cast<int64_t>(d.diverged)},
                                     {"without_counterpart", static_cast<int64_t>(d.without_counterpart)},
                                     {"unaligned", static_cast<int64_t>(d.unaligned)},
                                     {"max_error", formats::JsonNumber(d.max_error)},
                                     {"worst_op", d.worst}});
  }
  return out;
}

}  // namespace

std::optional<llvm::json::Object> ProxyOfRun(const formats::WorldStep& run) {
  if (run.ranks.empty() || !run.ranks[0].reader) return std::nullopt;
  absl::StatusOr<llvm::json::Object> info =
      formats::ReadObjectAnnotation(*run.ranks[0].reader, formats::kProxyAnnotation, -1, run.dir);
  if (!info.ok()) return std::nullopt;
  return *std::move(info);
}

std::optional<OriginalExpert> OriginalOf(const llvm::json::Object& proxy, const std::string& module) {
  const auto expert = formats::ExpertOf(module);
  if (!expert) return std::nullopt;
  const auto kept = formats::ProxyKeptExpert(proxy, expert->first, expert->second);
  if (!kept) return std::nullopt;
  // The placement names the proxy rank and the original rank (a run's proxy).
  const llvm::json::Array* placement = proxy.getArray("placement");
  for (size_t m = 0; placement != nullptr && m < placement->size(); ++m) {
    const llvm::json::Object* rank = (*placement)[m].getAsObject();
    const llvm::json::Array* layers = rank ? rank->getArray("layers") : nullptr;
    for (size_t i = 0; layers != nullptr && i < layers->size(); ++i) {
      const llvm::json::Object* l = (*layers)[i].getAsObject();
      const llvm::json::Array* experts = l ? l->getArray("experts") : nullptr;
      if (experts == nullptr || l->getInteger("layer") != expert->first) continue;
      for (size_t j = 0; j < experts->size(); ++j) {
        if ((*experts)[j].getAsInteger() != expert->second) continue;
        const auto host = formats::ProxyArrayAt(l, "original_ranks", static_cast<int64_t>(j));
        return OriginalExpert{expert->first, *kept, host.value_or(-1), static_cast<int64_t>(m)};
      }
    }
  }
  return std::nullopt;
}

bool StandsFor(const llvm::json::Object& proxy, const std::string& shown, const std::string& original) {
  const auto failed = formats::ExpertOf(original);
  const auto here = formats::ExpertOf(shown);
  if (!failed || !here) return !failed && !here && shown == original;
  if (failed->first != here->first) return false;
  const auto kept = formats::ProxyKeptExpert(proxy, here->first, here->second);
  return kept && (*kept == failed->second || formats::ProxyMapsTo(proxy, here->first, failed->second) == *kept);
}

std::optional<int64_t> ProxyRankOf(const llvm::json::Object& proxy, int64_t layer, int64_t expert) {
  const llvm::json::Object* plan = formats::ProxyLayerOf(proxy, layer);
  const llvm::json::Array* kept = plan ? plan->getArray("kept") : nullptr;
  const llvm::json::Array* placement = proxy.getArray("placement");
  if (kept == nullptr || placement == nullptr || placement->empty()) return std::nullopt;
  const auto mapped = formats::ProxyArrayAt(plan, "maps_to", expert);
  for (size_t j = 0; j < kept->size(); ++j) {
    const auto e = (*kept)[j].getAsInteger();
    if (e && (*e == expert || (mapped && *e == *mapped))) {
      // Proxy expert j is on proxy rank j / (kept / M).
      return static_cast<int64_t>(j / std::max<size_t>(1, kept->size() / placement->size()));
    }
  }
  return std::nullopt;
}

bool IsProxyRun(const std::string& path) {
  if (!formats::IsRunDirectory(path)) return false;
  absl::StatusOr<formats::WorldStep> run = formats::OpenWorld(path);
  return run.ok() && ProxyOfRun(*run).has_value();
}

absl::StatusOr<WorldReplayComparison> CompareWorldReplay(const std::string& run, const std::string& replay,
                                                         int64_t step, const replayer::WorldReplayPlan& plan) {
  WorldReplayComparison c;
  c.step = step;
  c.plan = plan;
  MOERR_ASSIGN_OR_RETURN(c.recorded_run, formats::OpenWorldStep(run, step));
  MOERR_ASSIGN_OR_RETURN(c.replayed_run, formats::OpenWorldStep(replay, step));
  c.recorded_metrics = Metrics(c.recorded_run);
  c.replayed_metrics = Metrics(c.replayed_run);
  c.proxy = ProxyOfRun(c.recorded_run);
  MOERR_ASSIGN_OR_RETURN(c.rank_cpu_seconds, RankCpuSeconds(c.replayed_run));
  c.replayed = analysis::FindWorldOverflow(c.replayed_run);
  if (c.proxy) return c;  // a proxy run records no ops
  diff::DiffOptions options;
  options.compare_bytes = false;  // the replay records fingerprints
  MOERR_ASSIGN_OR_RETURN(const std::vector<diff::WorldDiffPart> parts,
                         diff::DiffWorlds(c.recorded_run, c.replayed_run, options));
  for (const diff::WorldDiffPart& p : parts) c.parts.push_back(Summarize(p));
  MOERR_ASSIGN_OR_RETURN(c.dense, diff::DiffMergedDense(c.recorded_run, c.replayed_run, options.thresholds));
  c.recorded = analysis::FindWorldOverflow(c.recorded_run);
  return c;
}

bool Reproduced(const WorldReplayComparison& c) {
  if (c.proxy) return ProxyReproduced(c);
  if (!c.recorded || !c.replayed) return !c.recorded && !c.replayed;
  const formats::OpEvent &a = *c.recorded->cause.first.op, &b = *c.replayed->cause.first.op;
  return a.name == b.name && a.phase == b.phase && a.module == b.module;
}

void PrintWorldReplay(const WorldReplayComparison& c) {
  const replayer::WorldReplayPlan& p = c.plan;
  if (c.proxy) {
    std::printf("step %lld: the proxy run on its %lld rank(s) (EP %lld); it stands for the original's %lld ranks\n",
                static_cast<long long>(c.step), static_cast<long long>(p.ranks), static_cast<long long>(p.ep_size),
                static_cast<long long>(c.proxy->getInteger("original_ranks").getValueOr(0)));
  } else {
    std::printf("step %lld replayed on %lld rank(s) (EP %lld) from %lld (EP %lld): each replay rank stands for %lld\n",
                static_cast<long long>(c.step), static_cast<long long>(p.ranks), static_cast<long long>(p.ep_size),
                static_cast<long long>(p.original_ranks), static_cast<long long>(p.original_ep),
                static_cast<long long>(p.covers()));
  }
  const char* a = c.proxy ? "original" : "recorded";
  const char* b = c.proxy ? "proxy" : "replayed";
  for (const char* name : kMetrics) {
    std::printf("  %-10s %s %-16s %s %s\n", name, a, MetricText(c.recorded_metrics, name).c_str(), b,
                MetricText(c.replayed_metrics, name).c_str());
  }
  if (!c.proxy) PrintParts(c);
  const double device = Sum(c.rank_cpu_seconds);
  std::printf("  step time per rank %.3f s of CPU; device time (ranks x step time) %.3f s\n",
              device / std::max<size_t>(1, c.rank_cpu_seconds.size()), device);
  const std::string recorded = c.proxy ? FailureText(*c.proxy) : OverflowText(c.recorded, c.proxy);
  const bool failed = c.proxy ? c.proxy->getObject("failure") != nullptr : c.recorded.has_value();
  std::printf("  first overflow: %s %s\n                  %s %s\n", a, recorded.c_str(), b,
              OverflowText(c.replayed, c.proxy).c_str());
  if (failed) {
    std::printf("  %s\n", Reproduced(c) ? (c.proxy ? "the original's failure reproduces on the proxy's ranks"
                                                   : "the overflow reproduces: the same op of the same module")
                                        : "NOT REPRODUCED");
  }
}

llvm::json::Object WorldReplayJson(const WorldReplayComparison& c) {
  llvm::json::Object metrics;
  for (const char* name : kMetrics) {
    const llvm::json::Value* a = c.recorded_metrics.get(name);
    const llvm::json::Value* b = c.replayed_metrics.get(name);
    metrics[name] = llvm::json::Object{{"recorded", a ? *a : llvm::json::Value(nullptr)},
                                       {"replayed", b ? *b : llvm::json::Value(nullptr)}};
  }
  const llvm::json::Object* failure = c.proxy ? c.proxy->getObject("failure") : nullptr;
  return llvm::json::Object{
      {"step", c.step},
      {"proxy", c.proxy.has_value()},
      {"ranks", c.plan.ranks},
      {"ep_size", c.plan.ep_size},
      {"original_ranks", c.proxy ? c.proxy->getInteger("original_ranks").getValueOr(0) : c.plan.original_ranks},
      {"original_ep_size", c.proxy ? c.proxy->getInteger("original_ep_size").getValueOr(0) : c.plan.original_ep},
      {"metrics", std::move(metrics)},
      {"cost", llvm::json::Object{{"rank_cpu_seconds", llvm::json::Array(c.rank_cpu_seconds)},
                                  {"step_seconds_per_rank",
                                   Sum(c.rank_cpu_seconds) / std::max<size_t>(1, c.rank_cpu_seconds.size())},
                                  {"device_seconds", Sum(c.rank_cpu_seconds)}}},
      {"parts", PartsJson(c)},
      {"dense", DenseJson(c)},
      {"first_overflow",
       llvm::json::Object{{"recorded", c.proxy ? (failure ? llvm::json::Value(llvm::json::Object(*failure))
                                                          : llvm::json::Value(nullptr))
                                               : OverflowJson(c.recorded, c.proxy)},
                          {"replayed", OverflowJson(c.replayed, c.proxy)},
                          {"reproduced", Reproduced(c)}}}};
}

namespace {

bool SameMetrics(const WorldReplayComparison& c) {
  for (const char* name : kMetrics) {
    const llvm::json::Value* a = c.recorded_metrics.get(name);
    const llvm::json::Value* b = c.replayed_metrics.get(name);
    if (a == nullptr || b == nullptr) continue;  // not recorded
    const auto x = a->getAsNumber(), y = b->getAsNumber();
    if (x && y ? std::fabs(*x - *y) > kMetricTolerance * std::fabs(*x) + 1e-7
               : MetricText(c.recorded_metrics, name) != MetricText(c.replayed_metrics, name)) {
      return false;
    }
  }
  return true;
}

}  // namespace

int WorldReplayExitCode(const WorldReplayComparison& c) {
  // A proxy: an overflow, or the original's failure not shown, is a finding.
  if (c.proxy) return c.replayed || !Reproduced(c) ? kExitFinding : kExitOk;
  bool ok = Reproduced(c) && SameMetrics(c);
  for (const ReplayedPart& p : c.parts) ok = ok && p.diverged == 0 && p.unmatched == 0;
  // A replay rank whose dense ops could not be judged at all is no evidence.
  for (const diff::DenseDiff& d : c.dense) ok = ok && d.diverged == 0 && d.outputs > 0;
  return ok ? kExitOk : kExitFinding;
}

}  // namespace moerr::world
