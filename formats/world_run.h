// One step of a multi-rank run read back (world_manifest.h): every rank's
// bundle opened, its trace of the step read. A rank whose writer died left
// RUN/rank<K>.moerr.partial; it is salvaged in memory (salvage.h) and read
// to its last complete frame. A rank that cannot be read at all keeps its
// error, and the others are still read: a run with a dead rank is exactly
// what the tools must explain.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/salvage.h"
#include "formats/trace.h"
#include "formats/world_manifest.h"

namespace moerr::formats {

struct RankStep {
  int64_t rank = 0;
  std::string path;                       // the bundle read (…/rank<K>.moerr or its .partial)
  bool partial = false;                   // the writer did not finish: salvaged
  SalvageReport salvage;                  // when partial
  std::vector<int64_t> ring_steps;        // when partial: the steps its anomaly ring kept
  std::unique_ptr<BundleReader> reader;   // null when the bundle could not be opened
  std::optional<Trace> trace;             // the step's trace, when the bundle has the step
  bool step_complete = false;             // the step's stepEnd record is there
  absl::Status error;                     // why reader or trace is missing
};

struct WorldStep {
  std::string dir;
  WorldManifest manifest;
  int64_t step = -1;            // the step read; -1: none yet
  std::vector<RankStep> ranks;  // index = rank
};

// Opens a rank's bundle: as it is when finished, salvaged in memory when
// only a .partial exists. Sets path, partial, salvage and reader (or error).
void OpenRankBundle(const std::string& run_dir, const WorldRank& rank, RankStep& out);

// Every rank's bundle of the run at `run_dir` opened (OpenRankBundle), no
// step read yet (step -1). Errors only when the manifest cannot be read.
absl::StatusOr<WorldStep> OpenWorld(const std::string& run_dir);
// Reads step `step` of every opened rank into `world`, replacing the step
// read before; -1: the first step any rank's bundle has. NotFound when no
// rank has it.
absl::Status ReadWorldStep(WorldStep& world, int64_t step);
// OpenWorld, then ReadWorldStep.
absl::StatusOr<WorldStep> OpenWorldStep(const std::string& run_dir, int64_t step = -1);

}  // namespace moerr::formats
