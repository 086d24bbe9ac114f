// Precision bisect (DESIGN.md, "Bisect"): a set of modules whose upcast
// makes a step's overflow disappear, none of which can be dropped. Each trial replays the step
// under a policy that upcasts a candidate set (program_replay.h) and looks
// for an overflow in the replayed fingerprints (first_overflow.h). The search
// is delta debugging (Zeller's ddmin): it bisects the candidates first, then
// refines until removing any one module brings the failure back (a 1-minimal
// set, not necessarily the smallest one). Each module of a set stands for its
// own ops (a `module:` rule), not its submodules', so a set holds a module
// and one of its submodules when both are needed.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/first_overflow.h"
#include "formats/bundle_reader.h"
#include "llvm/Support/JSON.h"
#include "replayer/precision_policy.h"
#include "support/exit_code.h"

namespace moerr::replayer {

struct PrecisionBisectOptions {
  analysis::OverflowOptions overflow;  // what counts as the failure
  PolicyRule::Action upcast = PolicyRule::Action::kFp32;
  c10::Device device = c10::kCPU;
  std::function<void(size_t trial, size_t set_size)> on_trial;  // progress
};

struct PrecisionBisectResult {
  // The recorded failure.
  size_t op_index = 0;
  std::string op, module;
  formats::Phase phase = formats::Phase::kForward;
  // Modules of the ops a replay runs up to the end of the failing phase:
  // only they can change whether it fails.
  std::vector<std::string> candidates;
  // False when upcasting every candidate still fails: not a precision problem.
  bool removable = false;
  std::vector<std::string> modules;  // the 1-minimal set found, in execution order
  PrecisionPolicy policy;            // upcasts exactly `modules` (module: rules)
  size_t trials = 0;                 // replays run, the one with nothing upcast included
};

// `trace` is step `step` read from `reader`. NotFound when the step has no
// overflow to remove; FailedPrecondition when its replay with nothing
// upcast does not overflow (the replay does not reproduce the record).
absl::StatusOr<PrecisionBisectResult> PrecisionBisect(const formats::BundleReader& reader, int64_t step,
                                                      const formats::Trace& trace,
                                                      const PrecisionBisectOptions& options = {});

// A result of PrecisionBisect as `moerr bisect --precision` prints it; the
// policy's file is `policy_out` ("" when none was written).
void PrintPrecisionBisect(const PrecisionBisectResult& r, int64_t step, const std::string& upcast,
                          const std::string& policy_out);

// `moerr bisect --precision` of `step`: PrecisionBisect with progress on
// stderr, the set printed (or appended to `results` when `json`) and, when
// one removes the overflow and `policy_out` is not empty, written there as
// a policy file. `upcast` names the policy action ("fp32", "fp64").
// kExitFinding when an op overflows, kExitOk when none does.
ExitOr RunPrecisionBisect(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                          const analysis::OverflowOptions& overflow, const std::string& upcast,
                          const std::string& policy_out, bool json, llvm::json::Array& results);

}  // namespace moerr::replayer
