// A Flight Recorder import (importers/flight_recorder_import.h) read beside
// moerr's own recording of the same job (docs/IMPORT.md, "Beside moerr's
// own run"): the collectives the order analysis names (collective_order.h)
// looked up in the recording, which knows the module and phase of each.
//
// Numbering: both count a group's collectives, but Flight Recorder from the
// group's creation and moerr from the recording's start (moerr.record's own
// setup, all_gather_object, is among Flight Recorder's). Per group, the
// offset is the one under which every collective both sides hold has the
// same kind; of several (a loop's collectives repeat), the one under which
// the sides share the most collectives, then the largest (a dump taken at
// the hang ends where the recording ends). Every offset is judged at once,
// by correlating the sides' kinds (FFT), in O(n log n) for n numbers. A
// group moerr does not know, a rank absent from either run, a kind that
// differs at the aligned number are reported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/collective_order.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"

namespace moerr::analysis {

// One rank's collective at an aligned number, as the recording has it.
struct BesideCall {
  int64_t rank = -1;
  int64_t seq = -1;        // the recording's number (from 0)
  int64_t fr_seq = -1;     // the dump's, as the import stores it (collective_seq_id - 1)
  bool found = false;      // the recording holds it
  std::string kind, module, phase;  // phase "": it never returned (its failure annotation)
  std::string note;        // why not found, or how it differs from the dump
};

struct GroupBeside {
  std::string group;        // the order analysis' name ("world", "pg1")
  std::string moerr_group;  // the recording's ("world", "ranks:0,1"); "" when it has none
  int64_t offset = -1;      // Flight Recorder's number minus the recording's; -1: none found
  int64_t other_offsets = 0;  // further offsets that fit as well
  std::vector<BesideCall> completed;   // at the last collective every rank completed
  std::vector<BesideCall> disagreement;  // at the first disagreement: each side's rank
  std::string note;         // why nothing was aligned
  bool flight_recorder = false;  // the dump's numbers shown from 1, as GroupOrder's are
};

struct BesideRun {
  std::string dir;
  std::vector<std::string> rank_notes;  // "rank 1: bundle unfinished, read to its last complete frame"
  std::vector<GroupBeside> groups;      // in `order`'s order
};

// `order` from CheckCollectiveOrder(`fr`); the recording at `moerr_dir`.
// Errors only when `moerr_dir`'s manifest cannot be read.
absl::StatusOr<BesideRun> AlignBeside(const std::vector<GroupOrder>& order, const formats::WorldStep& fr,
                                      const std::string& moerr_dir);

// "beside moerr run R:" and a line per group: "group world is its world,
// numbered 7 later in the dump; last completed: rank 0 in #8 (layers.0,
// forward; moerr's all_reduce #0), ...; at the disagreement: ...", the
// dump's numbers shown as the order analysis shows them.
std::string DescribeBeside(const BesideRun& run);
llvm::json::Object BesideJson(const BesideRun& run);

}  // namespace moerr::analysis
