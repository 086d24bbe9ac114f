#include "tools/run_directory.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/cross_rank.h"
#include "formats/world_run.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {

absl::StatusOr<std::vector<RankBundle>> BundlesOf(const std::string& path, int64_t rank) {
  if (!formats::IsRunDirectory(path)) {
    if (rank >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("--rank needs a run directory (with world.json); %s is not one",
                                                        path));
    }
    return std::vector<RankBundle>{{-1, path}};
  }
  MOERR_ASSIGN_OR_RETURN(const formats::WorldManifest world, formats::ReadWorldManifest(path));
  if (rank >= world.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--rank %d: the run at %s has ranks 0 to %d", rank, path, world.world_size - 1));
  }
  std::vector<RankBundle> out;
  for (const formats::WorldRank& r : world.ranks) {
    if (rank < 0 || r.rank == rank) out.push_back({r.rank, formats::RankBundlePath(path, r)});
  }
  return out;
}

std::string RankPrefix(const RankBundle& b) { return b.rank < 0 ? "" : absl::StrFormat("rank %d: ", b.rank); }

bool SkipUnfinished(const RankBundle& b) {
  constexpr absl::string_view kPartial = ".partial";
  if (b.rank < 0 || !absl::EndsWith(b.path, kPartial)) return false;
  std::fprintf(stderr, "moerr: note: rank %lld: %s is unfinished (the rank died); `moerr salvage RUN` makes it "
               "readable\n", static_cast<long long>(b.rank), b.path.c_str());
  return true;
}

absl::StatusOr<int> CheckRunCollectives(const std::string& dir, const std::vector<int64_t>& steps,
                                        llvm::json::Array* json) {
  std::vector<int64_t> todo = steps;
  if (todo.empty()) {
    MOERR_ASSIGN_OR_RETURN(const formats::WorldStep first, formats::OpenWorldStep(dir));
    if (first.ranks[0].reader) todo = first.ranks[0].reader->CompleteSteps();
    if (todo.empty()) todo = {first.step};  // a step no rank finished: check what was exchanged before it stopped
  }
  int exit_code = kExitOk;
  for (int64_t step : todo) {
    MOERR_ASSIGN_OR_RETURN(const formats::WorldStep world, formats::OpenWorldStep(dir, step));
    const std::vector<analysis::CollectiveMismatch> found = analysis::CheckCollectives(world);
    size_t collectives = 0;
    for (const formats::RankStep& r : world.ranks) {
      if (!r.trace) continue;
      for (const formats::OpEvent& op : r.trace->ops) collectives += formats::IsCollective(op);
    }
    if (!found.empty()) exit_code = kExitFinding;
    if (json != nullptr) {
      llvm::json::Array list;
      for (const analysis::CollectiveMismatch& m : found) {
        list.push_back(llvm::json::Object{{"kind", m.collective.kind},   {"group", m.collective.group},
                                          {"seq", m.collective.seq},     {"module", m.module},
                                          {"sender", m.sender},          {"receiver", m.receiver},
                                          {"first_row", m.first_row},    {"rows", m.rows},
                                          {"what", m.what}});
      }
      json->push_back(llvm::json::Object{{"step", step},
                                         {"collectives", static_cast<int64_t>(collectives)},
                                         {"mismatches", std::move(list)}});
      continue;
    }
    std::printf("step %lld: cross-rank check of %zu collective records: %s\n", static_cast<long long>(step),
                collectives, found.empty() ? "every rank received what was sent" : "MISMATCH");
    for (const analysis::CollectiveMismatch& m : found) {
      std::printf("  %s: rank %lld -> rank %lld, rows [%lld, %lld) of what rank %lld received: %s\n",
                  formats::DescribeCollective(m.collective, m.module).c_str(), static_cast<long long>(m.sender),
                  static_cast<long long>(m.receiver), static_cast<long long>(m.first_row),
                  static_cast<long long>(m.first_row + m.rows), static_cast<long long>(m.receiver), m.what.c_str());
    }
  }
  return exit_code;
}

}  // namespace moerr::tools
