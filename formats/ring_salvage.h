// Salvage of a recording whose anomaly ring outlived its process
// (recorder/anomaly_ring.h): the bundle PATH (PATH.partial while it was
// written) and the ring beside it,
//
//   PATH.ring/step<S>.moerr[.partial]   one bundle per step of the ring
//
// are rebuilt into one bundle: the recording's own frames, then each slot,
// oldest step first, each salvaged as a bundle is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/limits.h"
#include "formats/salvage.h"

namespace moerr::formats {

// The ring directory of the bundle at `bundle_path` (its final name).
std::string RingDirectory(const std::string& bundle_path);
// A slot's file in `dir`: step<S>.moerr.
std::string RingSlotPath(const std::string& dir, int64_t step);

struct RingSlotFile {
  int64_t step = 0;
  std::string path;  // the slot's file: finished, or .partial
};
// The slots beside the bundle at `path` (its final name or its .partial),
// by step; empty when it has no ring.
std::vector<RingSlotFile> RingSlots(const std::string& path);

struct RingSalvageReport {
  SalvageReport bundle;  // the recording's own file
  struct Slot {
    int64_t step = 0;
    SalvageReport report;
  };
  std::vector<Slot> slots;  // the ring's, oldest first
};

// Writes OUT from IN (a bundle or its .partial) and the slots of its ring.
// Without a ring, Salvage(in, out).
absl::StatusOr<RingSalvageReport> SalvageWithRing(const std::string& in, const std::string& out, bool overwrite,
                                                  const Limits& limits = {});

}  // namespace moerr::formats
