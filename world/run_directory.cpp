#include "world/run_directory.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/cross_rank.h"
#include "analysis/world_overflow.h"
#include "formats/world_run.h"
#include "support/exit_code.h"
#include "support/status.h"

namespace moerr::world {

absl::StatusOr<std::vector<RankBundle>> BundlesOf(const std::string& path, int64_t rank) {
  if (!formats::IsRunDirectory(path)) {
    if (rank >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("--rank needs a run directory (with world.json); %s is not one",
                                                        path));
    }
    return std::vector<RankBundle>{{-1, path, false}};
  }
  MOERR_ASSIGN_OR_RETURN(const formats::WorldManifest world, formats::ReadWorldManifest(path));
  if (rank >= world.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--rank %d: the run at %s has ranks 0 to %d", rank, path, world.world_size - 1));
  }
  std::vector<RankBundle> out;
  for (const formats::WorldRank& r : world.ranks) {
    if (rank < 0 || r.rank == rank) {
      const std::string bundle = formats::RankBundlePath(path, r);
      out.push_back({r.rank, bundle, absl::EndsWith(bundle, formats::kPartialSuffix)});
    }
  }
  return out;
}

absl::StatusOr<RankBundle> OneRankOf(const std::string& path, int64_t rank, int64_t step, std::string* why) {
  if (why != nullptr) why->clear();
  if (!formats::IsRunDirectory(path) || rank >= 0) {
    MOERR_ASSIGN_OR_RETURN(const std::vector<RankBundle> bundles, BundlesOf(path, rank));
    if (bundles.empty()) return absl::NotFoundError(absl::StrFormat("%s lists no rank %d", path, rank));
    return bundles.front();
  }
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(path));
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps,
                         RunSteps(world, step >= 0 ? std::vector<int64_t>{step} : std::vector<int64_t>{}));
  for (int64_t s : steps) {
    MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, s));
    if (const std::optional<analysis::WorldOverflow> found = analysis::FindWorldOverflow(world)) {
      // The origin's first overflow may be values that arrived back from the
      // ranks its own exploded rows overflowed on: nothing on it overflows
      // from finite inputs, so the rank the walk started on is reduced.
      int64_t target = found->rank;
      std::string reason = ", where the overflow began";
      const auto at_origin = std::find_if(found->ranks.begin(), found->ranks.end(),
                                          [&](const analysis::RankOverflow& r) { return r.rank == found->rank; });
      if (at_origin != found->ranks.end() && at_origin->arrived && !found->path.walks.empty() &&
          found->path.walks.front().rank != found->rank) {
        target = found->path.walks.front().rank;
        reason = absl::StrFormat(", whose first overflow is made from finite inputs there; the overflow began on "
                                 "rank %d, whose first non-finite values arrived through a collective (moerr "
                                 "bisect %s names the path)",
                                 found->rank, path);
      }
      MOERR_ASSIGN_OR_RETURN(const std::vector<RankBundle> bundles, BundlesOf(path, target));
      if (why != nullptr) *why = reason;
      return bundles.front();
    }
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: %s of the run overflows, so there is no rank where an overflow began; --rank K picks a rank to reduce",
      path, step >= 0 ? absl::StrFormat("step %d", step) : std::string("no step")));
}

std::string RankPrefix(const RankBundle& b) { return b.rank < 0 ? "" : absl::StrFormat("rank %d: ", b.rank); }

bool SkipUnfinished(const RankBundle& b) {
  if (!b.partial) return false;
  std::fprintf(stderr, "moerr: note: rank %lld: %s is unfinished (the rank died); `moerr salvage RUN` makes it "
               "readable\n", static_cast<long long>(b.rank), b.path.c_str());
  return true;
}

absl::StatusOr<std::vector<int64_t>> RunSteps(formats::WorldStep& world, const std::vector<int64_t>& requested) {
  if (!requested.empty()) return requested;
  std::vector<int64_t> steps;
  if (world.ranks[0].reader) steps = world.ranks[0].reader->CompleteSteps();
  if (!steps.empty()) return steps;
  // No step rank 0 finished: the first any rank has, to explain what happened there.
  MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, -1));
  return std::vector<int64_t>{world.step};
}

ExitOr CheckRunCollectives(const std::string& dir, const std::vector<int64_t>& steps,
                           llvm::json::Array* json) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(dir));
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> todo, RunSteps(world, steps));
  int exit_code = kExitOk;
  for (int64_t step : todo) {
    MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
    const std::vector<analysis::CollectiveMismatch> found = analysis::CheckCollectives(world);
    size_t collectives = 0;
    for (const formats::RankStep& r : world.ranks) collectives += r.trace ? formats::CountCollectives(*r.trace) : 0;
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

}  // namespace moerr::world
