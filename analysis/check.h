// moerr lint (DESIGN.md, "Static analysis"): checks over a recorded step that
// need no re-run. A check is one file in checks/ plus one line in
// check_list.cpp; each appends findings with the numbers behind them and,
// where one helps, the command to run next.
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

struct LintInput {
  StepView bundle;
  std::optional<StepView> original;  // a proxy's original (proxy checks only)
};

class Check {
 public:
  virtual ~Check() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::string_view summary() const = 0;  // one line
  // Appends to `out`; an error means the bundle could not be read.
  virtual absl::Status Run(const LintInput& input, std::vector<Finding>& out) const = 0;
};

// Every check, in report order (check_list.cpp).
std::vector<std::unique_ptr<Check>> AllChecks();

// Runs every check, or those named in `only` (an unknown name is an error).
absl::StatusOr<std::vector<Finding>> RunChecks(const LintInput& input, const std::vector<std::string>& only = {});

}  // namespace moerr::analysis
