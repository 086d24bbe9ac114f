#include "world/run_directory.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/cross_rank.h"
#include "analysis/world_overflow.h"
#include "formats/collective_op.h"
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

namespace {

// Whether `r`'s first overflow is an op of its own (not values that arrived
// in a collective), which a reduce of that rank alone replays.
bool OverflowsOnItsOwn(const analysis::WorldOverflow& found, int64_t rank) {
  for (const analysis::RankOverflow& r : found.ranks) {
    if (r.rank == rank) return !r.arrived && r.op != nullptr && !formats::IsCollective(*r.op);
  }
  return false;
}

// The rank a reduce of the run takes: the origin when its first overflow is
// its own; else the rank bisect's walk started on, else the first rank whose
// first overflow is its own (the origin's exploded rows overflowed there).
absl::StatusOr<int64_t> ReducibleRank(const analysis::WorldOverflow& found, const std::string& path, int64_t step) {
  if (OverflowsOnItsOwn(found, found.rank)) return found.rank;
  if (!found.path.walks.empty() && OverflowsOnItsOwn(found, found.path.walks.front().rank)) {
    return found.path.walks.front().rank;
  }
  for (const analysis::RankOverflow& r : found.ranks) {
    if (OverflowsOnItsOwn(found, r.rank)) return r.rank;
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s, step %d: on every rank the first values that are not finite arrived through a collective, so no rank's "
      "step overflows on its own; moerr bisect %s names where they began",
      path, step, path));
}

}  // namespace

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
      MOERR_ASSIGN_OR_RETURN(const int64_t target, ReducibleRank(*found, path, world.step));
      MOERR_ASSIGN_OR_RETURN(const std::vector<RankBundle> bundles, BundlesOf(path, target));
      if (why != nullptr) {
        *why = target == found->rank
                   ? ", where the overflow began"
                   : absl::StrFormat(", whose first overflow an op of its own made; the overflow began on rank %d, "
                                     "where no op overflowed on its own (moerr bisect %s names the path)",
                                     found->rank, path);
      }
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
      // Rows for a slice of an all_to_all; other kinds move one whole tensor.
      const std::string rows = m.rows > 0 ? absl::StrFormat(", rows [%d, %d) of what rank %d received", m.first_row,
                                                            m.first_row + m.rows, m.receiver)
                                          : "";
      std::printf("  %s: rank %lld -> rank %lld%s: %s\n", formats::DescribeCollective(m.collective, m.module).c_str(),
                  static_cast<long long>(m.sender), static_cast<long long>(m.receiver), rows.c_str(), m.what.c_str());
    }
  }
  return exit_code;
}

}  // namespace moerr::world
