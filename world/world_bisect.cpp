#include "world/world_bisect.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/cause_bisect.h"
#include "analysis/world_overflow.h"
#include "formats/annotations.h"
#include "formats/json_output.h"
#include "formats/world_run.h"
#include "replayer/vendor_check.h"
#include "support/status.h"
#include "world/replay_ranks.h"
#include "world/run_directory.h"
#include "world/world_replay_comparison.h"

namespace moerr::world {
namespace {

// What the walk across ranks crossed (analysis/cross_rank_walk.h): which
// sender's rows held the values each receiver got, and how that is known.
void PrintCrossings(const analysis::CrossRankPath& path) {
  for (const analysis::Crossing& x : path.crossings) {
    const std::string what = x.not_finite ? "values that are not finite" : "the large values";
    const std::string how = x.evidence == "values" ? "read from the received values"
                            : x.evidence == "inputs" ? "each sender's input is what it sent"
                                                     : "from whole inputs' statistics only";
    std::printf("  %s: rank %lld received %s (%s)\n", formats::DescribeCollective(x.collective, x.module).c_str(),
                static_cast<long long>(x.receiver), what.c_str(), how.c_str());
    for (const analysis::Carrier& k : x.carriers) {
      const std::string magnitude = k.finite ? absl::StrFormat("abs-max %.6g", k.abs_max) : "not finite";
      if (k.sent_row >= 0) {
        std::printf("    from rank %lld: its rows %lld-%lld, rows %lld-%lld there, %s\n",
                    static_cast<long long>(k.rank), static_cast<long long>(k.sent_row),
                    static_cast<long long>(k.sent_row + k.rows - 1), static_cast<long long>(k.received_row),
                    static_cast<long long>(k.received_row + k.rows - 1), magnitude.c_str());
      } else {
        std::printf("    from rank %lld: its input, %s\n", static_cast<long long>(k.rank), magnitude.c_str());
      }
    }
    if (x.ambiguous) {
      std::printf("    ambiguous: more than one of these senders' inputs holds %s, and the recording stores no "
                  "received values to tell whose rows did (a stats recording, or a summed collective): the walk "
                  "stops here\n",
                  what.c_str());
    }
  }
}

// Where the overflow went from its origin, and each rank's own first overflow.
void PrintWorldOverflow(const analysis::WorldOverflow& found) {
  if (!found.path.crossings.empty()) {
    std::printf("  path: %s\n", analysis::DescribePath(found.path).c_str());
    PrintCrossings(found.path);
  } else if (found.carried) {
    const analysis::CauseLink& cause = found.cause.cause;
    std::printf("  path: rank %lld %s in %s -> %s -> the ranks' later ops\n", static_cast<long long>(found.rank),
                cause.op->name.c_str(), cause.op->module.empty() ? "(no module)" : cause.op->module.c_str(),
                formats::DescribeCollective(*found.carried, found.carried_module).c_str());
  }
  if (found.spread) {
    std::vector<std::string> reached;
    for (int64_t r : found.reached) reached.push_back(absl::StrFormat("%d", r));
    std::printf("  spread: rank %lld sent non-finite values in %s%s%s\n", static_cast<long long>(found.rank),
                formats::DescribeCollective(*found.spread, found.spread_module).c_str(),
                reached.empty() ? "" : " -> ranks ", absl::StrJoin(reached, ", ").c_str());
  }
  for (const analysis::RankOverflow& r : found.ranks) {
    std::printf("  rank %lld: first overflow at op %zu, %s in %s%s\n", static_cast<long long>(r.rank), r.op_index,
                r.op->name.c_str(), r.op->module.empty() ? "(no module)" : r.op->module.c_str(),
                r.arrived    ? " (arrived from another rank)"
                : r.received ? " (its large values arrived in a collective from another rank)"
                             : "");
  }
}

// Where the walk across ranks ended: "origin" (at `rank`'s op), "ambiguous",
// "leaf" (a sender's input no op made) or "unexploded" (no walk ended at an
// op that exploded); in all but the first, `rank` is the rank it started on.
const char* PathEnd(const analysis::WorldOverflow& found) {
  if (found.path.leaf) return "leaf";
  if (found.path.stopped) return "ambiguous";
  return found.unexploded ? "unexploded" : "origin";
}

llvm::json::Object WorldOverflowJson(const analysis::WorldOverflow& found, int64_t step) {
  llvm::json::Object out = analysis::CauseJson(found.cause, step);
  out["rank"] = found.rank;
  // What the top-level op keys describe: the rank's first overflow, or
  // (crossed) the origin's op whose output it sent, judged against no range.
  out["op_is"] = found.Crossed() ? "sent_value" : "first_overflow";
  if (found.Crossed()) out["limit"] = nullptr;
  llvm::json::Array ranks;
  for (const analysis::RankOverflow& r : found.ranks) {
    ranks.push_back(llvm::json::Object{{"rank", r.rank}, {"op_index", static_cast<int64_t>(r.op_index)},
                                       {"op", r.op->name}, {"module", r.op->module}, {"arrived", r.arrived},
                                       {"received", r.received}});
  }
  out["ranks"] = std::move(ranks);
  // Origin first: the ranks and the collectives the cause walk crossed.
  out["path"] = analysis::PathJson(found.path);
  out["path_stopped"] = found.path.stopped;
  out["path_end"] = PathEnd(found);
  if (!found.path.crossings.empty()) {
    // The first overflow the walk started from (the top-level op is then the origin's op that sent the values).
    const analysis::RankWalk& start = found.path.walks.front();
    out["started_on"] = llvm::json::Object{{"rank", start.rank},
                                           {"op_index", static_cast<int64_t>(start.walk.first.op_index)},
                                           {"op", start.walk.first.op->name},
                                           {"module", start.walk.first.op->module}};
  }
  if (found.carried) {
    out["carried"] = llvm::json::Object{{"kind", found.carried->kind}, {"group", found.carried->group},
                                        {"seq", found.carried->seq}, {"module", found.carried_module}};
  }
  if (found.spread) {
    out["spread"] = llvm::json::Object{{"kind", found.spread->kind},   {"group", found.spread->group},
                                       {"seq", found.spread->seq},     {"module", found.spread_module},
                                       {"from", found.rank},           {"to", llvm::json::Array(found.reached)}};
  }
  return out;
}

// msprobe's overflow_check beside the origin's own first overflow, for a
// run imported with its result (analysis::OverflowCheckCrossCheck); none
// when the origin has no overflow of its own (its values left it first).
// Not found.cause.first: after a crossing that is the op whose output it sent.
std::optional<llvm::json::Object> OriginOverflowCheck(const formats::WorldStep& world,
                                                      const analysis::WorldOverflow& found, int64_t step) {
  const formats::RankStep& origin = world.ranks[static_cast<size_t>(found.rank)];
  const auto own = std::find_if(found.ranks.begin(), found.ranks.end(),
                                [&](const analysis::RankOverflow& r) { return r.rank == found.rank; });
  if (!origin.reader || own == found.ranks.end()) return std::nullopt;
  return analysis::OverflowCheckCrossCheck(*origin.reader, step, found.rank, own->op_index);
}

// The headline of a step whose overflow `found` names.
void PrintHeadline(const analysis::WorldOverflow& found, int64_t step, size_t ranks) {
  const auto s = static_cast<long long>(step);
  const auto r = static_cast<long long>(found.rank);
  if (const std::optional<analysis::SentLeaf>& leaf = found.path.leaf) {
    const std::string what = leaf->tensor == 0 ? std::string("a value its record does not name")
                             : absl::StrFormat("its input tensor %d%s", leaf->tensor,
                                               leaf->name.empty() ? "" : " (" + leaf->name + ")");
    std::printf("step %lld: the overflow reached rank %lld of %zu from rank %lld, which sent %s, made by no op of "
                "its step (a parameter or the batch) (below); rank %lld's own walk:\n",
                s, r, ranks, static_cast<long long>(leaf->rank), what.c_str(), r);
  } else if (found.path.stopped) {
    std::printf("step %lld: the overflow reached rank %lld of %zu from another rank, which the recording does "
                "not tell (below); rank %lld's own walk:\n",
                s, r, ranks, r);
  } else if (found.unexploded) {
    std::printf("step %lld: the walk across ranks ends at no op that exploded (below); rank %lld of %zu, the first "
                "in causal order, and its own walk:\n",
                s, r, ranks);
  } else {
    std::printf("step %lld: the overflow began on rank %lld of %zu\n", s, r, ranks);
  }
}

}  // namespace

ExitOr RunWorldBisect(const std::string& dir, std::vector<int64_t> steps,
                      const analysis::OverflowOptions& options, const replayer::OpReferences& references,
                      bool json) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(dir));
  const std::optional<llvm::json::Object> proxy = ProxyOfRun(world);
  MOERR_ASSIGN_OR_RETURN(steps, RunSteps(world, steps));
  llvm::json::Array results;
  int exit_code = kExitOk;
  for (int64_t step : steps) {
    MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
    std::optional<analysis::WorldOverflow> found = analysis::FindWorldOverflow(world, options);
    if (found) {
      const formats::RankStep& origin = world.ranks[static_cast<size_t>(found->rank)];
      absl::StatusOr<llvm::json::Object> imported =
          origin.reader
              ? formats::ReadObjectAnnotation(*origin.reader, formats::kImportedStepAnnotation, step, origin.path)
              : absl::NotFoundError("");
      if (imported.ok()) {
        analysis::AddUncertainLinks(llvm::json::Value(*std::move(imported)), *origin.trace, found->cause);
      }
    }
    llvm::json::Object result;
    if (!found) {
      if (json) result = llvm::json::Object{{"step", step}, {"found", false}};
      else std::printf("step %lld: no overflowing op on any of %zu ranks\n", static_cast<long long>(step),
                       world.ranks.size());
    } else if (json) {
      exit_code = kExitFinding;
      result = WorldOverflowJson(*found, step);
      if (auto check = OriginOverflowCheck(world, *found, step)) result["msprobe_overflow_check"] = std::move(*check);
      if (const auto original = proxy ? OriginalOf(*proxy, found->cause.first.op->module) : std::nullopt) {
        result["proxy_rank"] = original->proxy_rank;
        result["original_expert"] = original->expert;
        result["original_rank"] = original->rank;
      }
    } else {
      exit_code = kExitFinding;
      const formats::Trace& trace = *world.ranks[static_cast<size_t>(found->rank)].trace;
      PrintHeadline(*found, step, world.ranks.size());
      analysis::PrintCause(found->cause, trace.ops.size(), step, !found->Crossed());
      PrintWorldOverflow(*found);
      if (auto check = OriginOverflowCheck(world, *found, step)) analysis::PrintOverflowCheck(*check, found->rank);
      if (const auto original = proxy ? OriginalOf(*proxy, found->cause.first.op->module) : std::nullopt) {
        std::printf("  the proxy's expert is on proxy rank %lld and stands for the original's expert %lld of layer "
                    "%lld, hosted by original rank %lld\n",
                    static_cast<long long>(original->proxy_rank), static_cast<long long>(original->expert),
                    static_cast<long long>(original->layer), static_cast<long long>(original->rank));
      }
    }
    exit_code = std::max(exit_code, replayer::ReportRankVendorOps(world, references, json ? &result : nullptr));
    if (json) results.push_back(std::move(result));
  }
  if (json) formats::PrintJson(std::move(results));
  return exit_code;
}

ExitOr BisectProxyRun(const std::string& dir, const std::vector<int64_t>& steps,
                      const analysis::OverflowOptions& options, const replayer::OpReferences& references,
                      bool json) {
  if (steps.size() > 1) return absl::InvalidArgumentError("a proxy run holds one step: pass one --step");
  char tmp[] = "/tmp/moerr-bisect-XXXXXX";
  if (::mkdtemp(tmp) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
  if (!json) std::printf("%s is a proxy run: its step is replayed in this process to find its ops\n", dir.c_str());
  const absl::Status replayed = ReplayInProcess(dir, steps.empty() ? -1 : steps[0], tmp);
  ExitOr result = replayed.ok() ? RunWorldBisect(tmp, steps, options, references, json) : replayed;
  std::filesystem::remove_all(tmp);
  return result;
}

}  // namespace moerr::world
