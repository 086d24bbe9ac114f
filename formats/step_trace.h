// One step of a bundle read back: the opened bundle and the step's trace.
// Free of LibTorch, for the commands and the analyses that only read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"

namespace moerr::formats {

struct StepTrace {
  std::unique_ptr<BundleReader> reader;
  std::string path;
  int64_t step = 0;
  Trace trace;
};

// Step `step` of the bundle at `path`; -1: its first complete step.
absl::StatusOr<StepTrace> OpenStepTrace(const std::string& path, int64_t step = -1);

}  // namespace moerr::formats
