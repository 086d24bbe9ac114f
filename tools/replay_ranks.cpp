#include "tools/replay_ranks.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "absl/strings/str_format.h"
#include "analysis/world_overflow.h"
#include "diff/world_diff.h"
#include "distributed/process_group.h"
#include "formats/module_path.h"
#include "formats/world_manifest.h"
#include "formats/world_run.h"
#include "replayer/world_replay.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "tools/run_directory.h"
#include "tools/train_ranks.h"

namespace moerr::tools {
namespace {

// Where the launcher tells its ranks to record (the directory it reads back).
constexpr char kOutEnv[] = "MOERR_REPLAY_OUT";

absl::StatusOr<int64_t> StepToReplay(formats::WorldStep &world, const ReplayRanksArgs &args) {
  if (args.steps.size() > 1) return absl::InvalidArgumentError("--ranks replays one step: pass one --step");
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, RunSteps(world, args.steps));
  return steps.front();
}

// This rank's part of the replay (the whole of it when `parallel` is null).
absl::Status ReplayPart(const ReplayRanksArgs &args, const std::string &out, int64_t rank, moe::Parallel *parallel) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(args.run));
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(world.manifest, args.ranks));
  MOERR_ASSIGN_OR_RETURN(const int64_t step, StepToReplay(world, args));
  MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
  replayer::WorldReplayOptions options;
  options.record_path = absl::StrFormat("%s/rank%d.moerr", out, rank);
  options.overwrite = true;  // the launcher claimed the directory
  return replayer::ReplayWorldRank(world, plan, rank, parallel, options).status();
}

// A rank the launcher started: join the replay's world and replay its part.
CommandResult ReplayAsRank(const ReplayRanksArgs &args, const distributed::RankEnv &env) {
  const char *out = ::getenv(kOutEnv);
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RANK is set but %s is not: replay --ranks starts its "
                        "own ranks; run it without RANK",
                        kOutEnv));
  }
  MOERR_ASSIGN_OR_RETURN(const formats::WorldManifest manifest, formats::ReadWorldManifest(args.run));
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(manifest, args.ranks));
  RanksOptions world;
  world.ranks = plan.ranks;
  world.ep = plan.ep_size;
  world.collective_timeout_s = args.collective_timeout_s;
  MOERR_ASSIGN_OR_RETURN(RankSession session, JoinAsRank(env, world));
  const absl::Status s = ReplayPart(args, out, env.rank, session.parallel.get());
  if (!s.ok()) return absl::Status(s.code(), absl::StrFormat("replay rank %d: %s", env.rank, s.message()));
  return kExitOk;
}

// The replayed run's directory: --out (new or empty, or --force), or a
// temporary one.
absl::StatusOr<std::string> ClaimOut(const ReplayRanksArgs &args) {
  if (args.out.empty()) {
    char dir[] = "/tmp/moerr-replay-XXXXXX";
    if (::mkdtemp(dir) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
    return std::string(dir);
  }
  std::error_code ec;
  if (std::filesystem::exists(args.out, ec) && !std::filesystem::is_empty(args.out, ec) && !args.force) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s exists and is not empty: pass --force to replace the replay in it", args.out));
  }
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.out, {args.run}));
  MOERR_RETURN_IF_ERROR(MakeDirectory(args.out));
  return args.out;
}

// ---- Comparing the replay with the record -------------------------------

struct PartSummary {
  std::string what;
  int64_t rank_a = 0, rank_b = 0;
  size_t ops = 0, bitwise = 0, diverged = 0, unmatched = 0;
  double max_error = 0;
  std::string worst;  // the op with the largest error
};

struct Comparison {
  int64_t step = 0;
  replayer::WorldReplayPlan plan;
  llvm::json::Object recorded_metrics, replayed_metrics;
  std::vector<PartSummary> parts;
  // The two runs' step; the overflows point into their traces (a move of
  // the vector of ranks keeps them in place).
  formats::WorldStep a, b;
  std::optional<analysis::WorldOverflow> recorded, replayed;
};

PartSummary Summarize(const diff::WorldDiffPart &p) {
  PartSummary s{p.what, p.rank_a, p.rank_b};
  s.unmatched = p.report.only_a + p.report.only_b;
  for (const diff::OpDiff &op : p.report.ops) {
    if (op.a < 0 || op.b < 0) continue;
    ++s.ops;
    bool bitwise = true;
    for (const diff::OutputDiff &o : op.outputs) bitwise = bitwise && o.fingerprints.bitwise_equal;
    s.bitwise += bitwise ? 1 : 0;
    s.diverged += op.diverged ? 1 : 0;
    if (op.error > s.max_error) {
      s.max_error = op.error;
      const formats::OpEvent &e = p.a.ops[static_cast<size_t>(op.a)];
      s.worst = absl::StrFormat("%s (%s, %s)", e.name, e.module, formats::PhaseName(e.phase));
    }
  }
  return s;
}

llvm::json::Object Metrics(const formats::WorldStep &w) {
  const formats::RankStep &r = w.ranks[0];
  if (!r.reader) return {};
  auto m = r.reader->ReadAnnotation("metrics", w.step);
  return m.ok() && m->getAsObject() ? *m->getAsObject() : llvm::json::Object{};
}

absl::StatusOr<Comparison> Compare(const ReplayRanksArgs &args, const std::string &out, int64_t step,
                                   const replayer::WorldReplayPlan &plan) {
  Comparison c;
  c.step = step;
  c.plan = plan;
  MOERR_ASSIGN_OR_RETURN(c.a, formats::OpenWorldStep(args.run, step));
  MOERR_ASSIGN_OR_RETURN(c.b, formats::OpenWorldStep(out, step));
  c.recorded_metrics = Metrics(c.a);
  c.replayed_metrics = Metrics(c.b);
  diff::DiffOptions options;
  options.compare_bytes = false;  // the replay records fingerprints
  MOERR_ASSIGN_OR_RETURN(const std::vector<diff::WorldDiffPart> parts, diff::DiffWorlds(c.a, c.b, options));
  for (const diff::WorldDiffPart &p : parts) c.parts.push_back(Summarize(p));
  c.recorded = analysis::FindWorldOverflow(c.a);
  c.replayed = analysis::FindWorldOverflow(c.b);
  return c;
}

// The first overflow's op and module, "" when none.
std::string OverflowModule(const std::optional<analysis::WorldOverflow> &w) {
  return w ? w->cause.first.op->module : "";
}

bool Reproduced(const Comparison &c) {
  if (!c.recorded) return !c.replayed;
  return c.replayed && c.recorded->cause.first.op->name == c.replayed->cause.first.op->name &&
         c.recorded->cause.first.op->phase == c.replayed->cause.first.op->phase &&
         OverflowModule(c.recorded) == OverflowModule(c.replayed);
}

// A metric of the step as text: a number, "nan"/"inf" as MetricsToJson writes
// them, or "-".
std::string MetricText(const llvm::json::Object &m, const char *name) {
  const llvm::json::Value *v = m.get(name);
  if (v == nullptr) return "-";
  if (auto n = v->getAsNumber()) return absl::StrFormat("%.9g", *n);
  if (auto s = v->getAsString()) return s->str();
  return "-";
}

std::string OverflowText(const std::optional<analysis::WorldOverflow> &w) {
  if (!w) return "none";
  const analysis::FirstOverflow &f = w->cause.first;
  const auto expert = formats::ExpertOf(f.op->module);
  return absl::StrFormat("rank %d, op %d %s (%s, %s)%s", w->rank, f.op_index, f.op->name, f.op->module,
                         formats::PhaseName(f.op->phase),
                         expert ? absl::StrFormat(", expert %d of layer %d", expert->second, expert->first) : "");
}

const char *const kMetrics[] = {"loss", "grad_norm", "reward", "kl"};

void Print(const Comparison &c) {
  std::printf(
      "step %lld replayed on %lld rank(s) (EP %lld) from %lld (EP "
      "%lld): each replay rank stands for %lld\n",
      static_cast<long long>(c.step), static_cast<long long>(c.plan.ranks), static_cast<long long>(c.plan.ep_size),
      static_cast<long long>(c.plan.original_ranks), static_cast<long long>(c.plan.original_ep),
      static_cast<long long>(c.plan.covers()));
  for (const char *name : kMetrics) {
    std::printf("  %-10s recorded %-16s replayed %s\n", name, MetricText(c.recorded_metrics, name).c_str(),
                MetricText(c.replayed_metrics, name).c_str());
  }
  size_t ops = 0, bitwise = 0, diverged = 0;
  const PartSummary *worst = nullptr;
  for (const PartSummary &p : c.parts) {
    std::printf(
        "  %-10s rank %lld -> %lld: %4zu ops, %4zu bitwise, %zu "
        "diverged%s, max error %.3g\n",
        p.what.c_str(), static_cast<long long>(p.rank_a), static_cast<long long>(p.rank_b), p.ops, p.bitwise,
        p.diverged, p.unmatched ? absl::StrFormat(", %d unmatched", p.unmatched).c_str() : "", p.max_error);
    ops += p.ops, bitwise += p.bitwise, diverged += p.diverged;
    if (worst == nullptr || p.max_error > worst->max_error) worst = &p;
  }
  std::printf("  ops compared: %zu, bitwise %zu, within tolerance %zu, diverged %zu", ops, bitwise,
              ops - bitwise - diverged, diverged);
  if (worst != nullptr && worst->max_error > 0) {
    std::printf("; largest deviation %.3g at %s, %s", worst->max_error, worst->what.c_str(), worst->worst.c_str());
  }
  std::printf("\n  first overflow: recorded %s\n                  replayed %s%s\n", OverflowText(c.recorded).c_str(),
              OverflowText(c.replayed).c_str(),
              c.recorded ? (Reproduced(c) ? "\n  the overflow reproduces: the same op of the same module"
                                          : "\n  NOT REPRODUCED")
                         : "");
}

llvm::json::Value OverflowJson(const std::optional<analysis::WorldOverflow> &w) {
  if (!w) return nullptr;
  const analysis::FirstOverflow &f = w->cause.first;
  llvm::json::Object o{{"rank", w->rank},
                       {"op_index", static_cast<int64_t>(f.op_index)},
                       {"op", f.op->name},
                       {"module", f.op->module},
                       {"phase", std::string(formats::PhaseName(f.op->phase))}};
  if (const auto expert = formats::ExpertOf(f.op->module)) {
    o["layer"] = expert->first;
    o["expert"] = expert->second;
  }
  return o;
}

llvm::json::Object ToJson(const Comparison &c) {
  llvm::json::Array parts;
  for (const PartSummary &p : c.parts) {
    parts.push_back(llvm::json::Object{{"part", p.what},
                                       {"recorded_rank", p.rank_a},
                                       {"replay_rank", p.rank_b},
                                       {"ops", static_cast<int64_t>(p.ops)},
                                       {"bitwise", static_cast<int64_t>(p.bitwise)},
                                       {"diverged", static_cast<int64_t>(p.diverged)},
                                       {"unmatched", static_cast<int64_t>(p.unmatched)},
                                       {"max_error", JsonNumber(p.max_error)},
                                       {"worst_op", p.worst}});
  }
  llvm::json::Object metrics;
  for (const char *name : kMetrics) {
    const llvm::json::Value *a = c.recorded_metrics.get(name);
    const llvm::json::Value *b = c.replayed_metrics.get(name);
    metrics[name] = llvm::json::Object{{"recorded", a ? *a : llvm::json::Value(nullptr)},
                                       {"replayed", b ? *b : llvm::json::Value(nullptr)}};
  }
  return llvm::json::Object{{"step", c.step},
                            {"ranks", c.plan.ranks},
                            {"ep_size", c.plan.ep_size},
                            {"original_ranks", c.plan.original_ranks},
                            {"original_ep_size", c.plan.original_ep},
                            {"metrics", std::move(metrics)},
                            {"parts", std::move(parts)},
                            {"first_overflow", llvm::json::Object{{"recorded", OverflowJson(c.recorded)},
                                                                  {"replayed", OverflowJson(c.replayed)},
                                                                  {"reproduced", Reproduced(c)}}}};
}

int ExitCode(const Comparison &c) {
  bool ok = Reproduced(c);
  for (const PartSummary &p : c.parts) ok = ok && p.diverged == 0 && p.unmatched == 0;
  return ok ? kExitOk : kExitFinding;
}

// The launcher: claim the output, replay (in this process or on M ranks),
// compare, and remove a temporary output.
CommandResult LaunchReplay(const ReplayRanksArgs &args) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(args.run));
  MOERR_ASSIGN_OR_RETURN(const replayer::WorldReplayPlan plan, replayer::PlanWorldReplay(world.manifest, args.ranks));
  MOERR_ASSIGN_OR_RETURN(const int64_t step, StepToReplay(world, args));
  MOERR_ASSIGN_OR_RETURN(const std::string out, ClaimOut(args));
  const auto cleanup = [&] {
    if (args.out.empty()) std::filesystem::remove_all(out);
  };
  absl::Status s =
      formats::WriteWorldManifest(out, formats::ExpertParallelWorld(plan.ranks, plan.ep_size, plan.experts));
  if (s.ok() && plan.ranks == 1) s = ReplayPart(args, out, 0, nullptr);
  if (s.ok() && plan.ranks > 1) {
    RanksOptions ranks;
    ranks.ranks = plan.ranks;
    ranks.ep = plan.ep_size;
    ranks.collective_timeout_s = args.collective_timeout_s;
    ranks.env = {{kOutEnv, out}};
    ranks.quiet = args.json;
    absl::StatusOr<int> code = LaunchRanks(ranks);
    if (!code.ok()) s = code.status();
    if (s.ok() && *code != kExitOk) s = absl::AbortedError("the replay's ranks failed (above)");
  }
  absl::StatusOr<Comparison> c = s.ok() ? Compare(args, out, step, plan) : absl::StatusOr<Comparison>(s);
  cleanup();
  if (!c.ok()) return c.status();
  if (args.json) {
    PrintJson(ToJson(*c));
  } else {
    Print(*c);
    if (!args.out.empty()) std::printf("  the replay's run: %s\n", out.c_str());
  }
  return ExitCode(*c);
}

}  // namespace

CommandResult ReplayOnRanks(const ReplayRanksArgs &args) {
  MOERR_ASSIGN_OR_RETURN(const auto rank_env, distributed::RankFromEnvironment());
  if (rank_env.has_value()) return ReplayAsRank(args, *rank_env);
  if (!formats::IsRunDirectory(args.run)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ranks replays a multi-rank run directory "
                        "(world.json); %s is not one",
                        args.run));
  }
  return LaunchReplay(args);
}

}  // namespace moerr::tools
