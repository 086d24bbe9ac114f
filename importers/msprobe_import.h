// `moerr import msprobe DIR -o RUN`: an msprobe PyTorch dump (dump.json per
// step and rank, construct.json and stack.json when present, the tensor
// task's files under dump_tensor_data/) as moerr bundles, one per rank,
// RUN/rank<K>.moerr, with RUN/world.json when the ranks are 0..N-1
// (docs/IMPORT.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "importers/import_writer.h"

namespace moerr::importers {

// One dump.json of the layout: DIR/step<N>/rank<K>/dump.json.
struct DumpLocation {
  int64_t step = 0, rank = 0;
  std::string dir;  // the folder holding dump.json
};

// The dumps under `dir`: a dump_path (step*/rank*/), one step folder
// (rank*/), or one rank folder (dump.json itself). A folder named "rank"
// (a single-rank dump) is rank 0; proc<pid> folders (processes without a
// rank) are read as rank 0 when they are the only ones. Sorted by rank,
// then step. NotFound when there is no dump.json.
absl::StatusOr<std::vector<DumpLocation>> FindDumps(const std::string& dir);

absl::StatusOr<ImportResult> ImportMsprobe(const std::string& dir, const std::string& run_dir,
                                           const ImportOptions& options = {});

}  // namespace moerr::importers
