// moerr lint (DESIGN.md, "Static analysis"): checks over a recorded step, or
// a run's step on every rank, that need no re-run. A check is one file in
// checks/ plus one line in checks/checks.def; each appends findings with the
// numbers behind them and, where one helps, the command to run next. The one
// check that re-runs ops, vendor-op, does it through a VendorOpJudge that a
// layer with LibTorch passes in.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"

namespace moerr::analysis {

enum class Severity { kInfo, kWarning, kError };
absl::string_view SeverityName(Severity s);

struct Finding {
  std::string check;
  Severity severity = Severity::kInfo;
  int64_t step = -1;
  int64_t op_index = -1;      // -1: about a module, a layer or the step
  std::string op;             // the op's name, when about an op
  std::string where;          // module path, "layer N" or "step"
  std::string phase;          // when about an op
  std::string message;        // one line for people
  llvm::json::Object numbers;  // the numbers behind it
  std::string next;           // a command to run next, or empty
  int64_t rank = -1;          // the rank of a multi-rank run it is about; -1: none
};

// One recorded step as a check sees it.
struct StepView {
  const formats::BundleReader* reader = nullptr;
  std::string path;  // for suggested commands
  int64_t step = 0;
  const formats::Trace* trace = nullptr;
};

// What a check reads: one bundle's step (StepView), or a run's step read on
// every rank (formats::WorldStep).
enum class CheckScope { kStep, kRun };

// Runs the ops of a step that have a reference on their recorded inputs and
// judges their recorded outputs against it (replayer::ReferenceJudge),
// appending one finding per suspect op (its `check` is set by vendor-op). An
// error means the step could not be read; a step that cannot be replayed is
// no finding.
class VendorOpJudge {
 public:
  virtual ~VendorOpJudge() = default;
  virtual absl::Status Judge(const StepView& step, std::vector<Finding>& out) const = 0;
};

struct LintInput {
  StepView bundle;                   // kStep checks run when bundle.trace is set
  std::optional<StepView> original;  // a proxy's original (proxy checks only)
  const formats::WorldStep* world = nullptr;  // kRun checks run when set
  const VendorOpJudge* vendor_ops = nullptr;  // vendor-op finds nothing without one
};

class Check {
 public:
  virtual ~Check() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::string_view summary() const = 0;  // one line
  virtual CheckScope scope() const { return CheckScope::kStep; }
  // Appends to `out`; an error means the bundle could not be read.
  virtual absl::Status Run(const LintInput& input, std::vector<Finding>& out) const = 0;
};

// Every check, in report order (check_list.cpp).
std::vector<std::unique_ptr<Check>> AllChecks();

// InvalidArgument, listing the checks, when a name in `only` is no check's;
// or, when `path` is one bundle (not `run_directory`), naming a check of a
// run's step (CheckScope::kRun), which one bundle cannot give.
absl::Status CheckOnly(const std::vector<std::string>& only, const std::string& path, bool run_directory);
// Whether `only` (empty: every check) selects some check of `scope`.
bool SelectsAny(CheckScope scope, const std::vector<std::string>& only);

// Runs every check whose input `input` holds (see LintInput), or those of
// them named in `only` (a name no check has is an error); worst first.
absl::StatusOr<std::vector<Finding>> RunChecks(const LintInput& input, const std::vector<std::string>& only = {});

}  // namespace moerr::analysis
