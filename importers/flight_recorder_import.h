// `moerr import fr DIR|FILES -o RUN`: c10d Flight Recorder dumps, one per
// rank (flight_recorder_dump.h), as a run directory: RUN/rank<K>.moerr for
// each dump and RUN/world.json (docs/IMPORT.md, "Flight Recorder").
//
// Each entry becomes an op of its rank's step 0, in record order: a
// collective as formats/collective_op.h lays it out (kind, group, seq =
// collective_seq_id - 1), its input and output sizes and dtypes as tensor
// metadata whose values are unknown; a point-to-point op as a collective of
// kind send or recv in group "<group>/p2p", seq = p2p_seq_id - 1. What the
// trace has no field for (state, timestamps, duration, timeout, frames,
// thread, profiling_name) is the step's annotation
// formats::kFlightRecorderAnnotation, by op.
//
// A rank of the world without a dump keeps its place in world.json with no
// bundle: it is missing, which says nothing about whether it hung.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "importers/import_writer.h"

namespace moerr::importers {

struct FlightRecorderImportOptions : ImportOptions {
  // The world's size when no dump says it (gloo records no group members);
  // 0: the largest group a dump names, else the highest rank + 1.
  int64_t world_size = 0;
};

// `inputs`: one directory holding the dumps (every file whose name ends
// with a rank: <prefix><rank>, <prefix><rank>.json, one prefix), or the
// dump files themselves.
absl::StatusOr<ImportResult> ImportFlightRecorder(const std::vector<std::string>& inputs, const std::string& run_dir,
                                                  const FlightRecorderImportOptions& options = {});

// The trace's name of a Flight Recorder process group: "world" for the
// default group (desc "default_pg"; torch_npu leaves desc empty, and its
// default group has pg_id 0), else "pg<name>".
std::string FlightRecorderGroupName(const std::string& name, const std::string& desc, int64_t pg_id);

}  // namespace moerr::importers
