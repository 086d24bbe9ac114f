// A one-line progress bar for long work. Draws only when stderr is a
// terminal, so logs and CI output stay clean; redraws at most every 100 ms.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace moerr {

class Progress {
 public:
  // `total` units of work (0 = unknown); `label` prefixes the bar.
  Progress(std::string label, int64_t total);
  ~Progress();  // Finishes the line.

  void Update(int64_t done, absl::string_view note = {});
  void Finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// One bar per phase of a long job that reports (phase, done, total): a new
// bar starts when the phase changes.
class PhasedProgress {
 public:
  void Update(const std::string& phase, int64_t done, int64_t total);
  void Finish() { bar_.reset(); }

 private:
  std::string phase_;
  std::unique_ptr<Progress> bar_;
};

}  // namespace moerr
