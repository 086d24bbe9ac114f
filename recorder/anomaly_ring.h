// The anomaly trigger's ring (recorder.h, Trigger::kAnomaly): the last N
// steps, each streamed to a file of its own as it runs, so a process killed
// inside a step (SIGKILL from the OOM killer or a scheduler, a fatal
// signal) leaves the ring where `moerr salvage` finds it (docs/TRACE.md,
// "The anomaly ring").
//
//   PATH.ring/step<S>.moerr.partial   one bundle per step of the ring
//                                     (formats/ring_salvage.h reads them)
//
// A slot is a bundle of its own step alone, written as `always` writes the
// recording: a killed process loses only what had not reached the file.
// When a step is anomalous, every slot is copied, oldest first, into the
// recording and deleted. A healthy step's slot is deleted once N newer steps
// have begun: the disk holds at most N steps, however long the run.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_writer.h"

namespace moerr::recorder {

class AnomalyRing {
 public:
  // The ring of `steps` (>= 1) slots for the bundle at `bundle_path`. An
  // existing ring directory (a killed run's, not yet salvaged) is refused
  // unless `overwrite`.
  static absl::StatusOr<std::unique_ptr<AnomalyRing>> Create(const std::string& bundle_path, int64_t steps,
                                                             bool overwrite);
  ~AnomalyRing();  // leaves what is on disk: Discard or Keep first

  // Opens step `step`'s slot (writing its stepBegin) and deletes the oldest
  // beyond the ring's size.
  absl::Status Begin(int64_t step);
  // The slot of the step in progress; nullptr between steps.
  formats::BundleWriter* current() { return open_ ? slots_.back().writer.get() : nullptr; }
  // Ends the step in progress: complete (its stepEnd written) or not (a
  // raised step). The slot stays in the ring.
  absl::Status End(bool complete);
  // Copies every slot, oldest first, into `to`, then deletes them. Returns
  // the steps that were complete.
  absl::StatusOr<std::vector<int64_t>> KeepInto(formats::BundleWriter& to);
  // Deletes every slot and the directory: the run ended with nothing to keep.
  void Discard();
  // The descriptor a crash handler appends to: the step in progress's slot.
  int crash_fd() const;

 private:
  struct Slot {
    int64_t step = 0;
    bool complete = false;
    std::string path;
    std::unique_ptr<formats::BundleWriter> writer;
  };
  AnomalyRing(std::string dir, int64_t steps) : dir_(std::move(dir)), steps_(steps) {}
  static void Delete(Slot& slot);

  std::string dir_;
  int64_t steps_;
  std::deque<Slot> slots_;
  bool open_ = false;  // the back slot's step is in progress
};

}  // namespace moerr::recorder
