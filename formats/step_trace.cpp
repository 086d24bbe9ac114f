#include "formats/step_trace.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "support/status.h"

namespace moerr::formats {

absl::StatusOr<StepTrace> OpenStepTrace(const std::string& path, int64_t step) {
  StepTrace out;
  out.path = path;
  MOERR_ASSIGN_OR_RETURN(out.reader, BundleReader::Open(path));
  if (step < 0) {
    const std::vector<int64_t> complete = out.reader->CompleteSteps();
    if (complete.empty()) return absl::NotFoundError(path + " has no complete step");
    step = complete.front();
  }
  out.step = step;
  absl::StatusOr<Trace> trace = ReadTrace(*out.reader, step);
  if (!trace.ok()) return Annotate(trace.status(), absl::StrFormat("%s, step %d", path, step));
  out.trace = *std::move(trace);
  return out;
}

}  // namespace moerr::formats
