#include "formats/world_run.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/ring_salvage.h"
#include "llvm/Support/ThreadPool.h"
#include "support/status.h"

namespace moerr::formats {
namespace {

// A .partial bundle salvaged into a temporary file with its anomaly ring
// (ring_salvage.h), opened (the mapping outlives the file's name) and the
// file removed.
absl::StatusOr<std::unique_ptr<BundleReader>> OpenSalvaged(const std::string& path, SalvageReport& report,
                                                           std::vector<int64_t>& ring_steps) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string name = std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") + "/moerr-salvage-XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return absl::UnavailableError(absl::StrFormat("%s: cannot create a temporary file to salvage it", path));
  ::close(fd);
  absl::StatusOr<RingSalvageReport> salvaged = SalvageWithRing(path, name, /*overwrite=*/true);
  absl::StatusOr<std::unique_ptr<BundleReader>> reader =
      salvaged.ok() ? BundleReader::Open(name) : absl::StatusOr<std::unique_ptr<BundleReader>>(salvaged.status());
  ::unlink(name.c_str());
  if (salvaged.ok()) {
    report = salvaged->bundle;
    for (const RingSalvageReport::Slot& s : salvaged->slots) ring_steps.push_back(s.step);
  }
  return reader;
}

}  // namespace

void OpenRankBundle(const std::string& run_dir, const WorldRank& rank, RankStep& out) {
  out.rank = rank.rank;
  out.path = RankBundlePath(run_dir, rank);
  out.partial = absl::EndsWith(out.path, kPartialSuffix);
  auto reader = out.partial ? OpenSalvaged(out.path, out.salvage, out.ring_steps) : BundleReader::Open(out.path);
  if (reader.ok()) {
    out.reader = *std::move(reader);
  } else {
    out.error = reader.status();
  }
}

absl::StatusOr<WorldStep> OpenWorld(const std::string& run_dir) {
  WorldStep world;
  world.dir = run_dir;
  world.step = -1;
  MOERR_ASSIGN_OR_RETURN(world.manifest, ReadWorldManifest(run_dir));
  world.ranks.resize(world.manifest.ranks.size());
  for (size_t r = 0; r < world.ranks.size(); ++r) OpenRankBundle(run_dir, world.manifest.ranks[r], world.ranks[r]);
  return world;
}

namespace {

void ReadRankStep(RankStep& r, int64_t step) {
  r.trace.reset();
  r.error = absl::OkStatus();
  const std::vector<int64_t> s = r.reader->Steps(), complete = r.reader->CompleteSteps();
  r.step_complete = std::find(complete.begin(), complete.end(), step) != complete.end();
  if (std::find(s.begin(), s.end(), step) == s.end()) {
    r.error = absl::NotFoundError(absl::StrFormat("%s has no step %d", r.path, step));
    return;
  }
  absl::StatusOr<Trace> trace = ReadTrace(*r.reader, step);
  if (trace.ok()) {
    r.trace = *std::move(trace);
  } else {
    r.error = trace.status();
  }
}

}  // namespace

absl::Status ReadWorldStep(WorldStep& world, int64_t step) {
  std::vector<int64_t> steps;
  for (const RankStep& r : world.ranks) {
    if (!r.reader) continue;
    const std::vector<int64_t> s = r.reader->Steps();
    steps.insert(steps.end(), s.begin(), s.end());
  }
  if (step < 0) {
    if (steps.empty()) return absl::NotFoundError(absl::StrFormat("%s: no rank's bundle has a step", world.dir));
    step = *std::min_element(steps.begin(), steps.end());
  }
  if (!steps.empty() && std::find(steps.begin(), steps.end(), step) == steps.end()) {
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return absl::NotFoundError(absl::StrFormat("%s: no rank has step %d (steps recorded: %s)", world.dir, step,
                                               absl::StrJoin(steps, ", ")));
  }
  world.step = step;
  // Each rank's bundle is read on its own (a reader's const methods are safe
  // to call from several threads), in parallel: 64 ranks' traces take
  // seconds on one core.
  llvm::ThreadPool pool(llvm::hardware_concurrency());
  for (RankStep& r : world.ranks) {
    if (!r.reader) continue;  // keeps why it could not be opened
    pool.async([&r, step] { ReadRankStep(r, step); });
  }
  pool.wait();
  return absl::OkStatus();
}

absl::StatusOr<WorldStep> OpenWorldStep(const std::string& run_dir, int64_t step) {
  MOERR_ASSIGN_OR_RETURN(WorldStep world, OpenWorld(run_dir));
  MOERR_RETURN_IF_ERROR(ReadWorldStep(world, step));
  return world;
}

}  // namespace moerr::formats
