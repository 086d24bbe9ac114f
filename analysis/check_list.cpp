#include "analysis/check.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "support/enum_table.h"
#include "support/status.h"

namespace moerr::analysis {

// Defined in checks/, one file each, listed in checks/checks.def.
#define MOERR_CHECK_ENTRY(Name) std::unique_ptr<Check> Make##Name##Check();
#include "analysis/checks/checks.def"
#undef MOERR_CHECK_ENTRY

constexpr EnumName<Severity> kSeverities[] = {
    {Severity::kInfo, "info"}, {Severity::kWarning, "warning"}, {Severity::kError, "error"}};

absl::string_view SeverityName(Severity s) { return EnumNameOf(kSeverities, s, "?"); }

std::vector<std::unique_ptr<Check>> AllChecks() {
  std::vector<std::unique_ptr<Check>> checks;
#define MOERR_CHECK_ENTRY(Name) checks.push_back(Make##Name##Check());
#include "analysis/checks/checks.def"
#undef MOERR_CHECK_ENTRY
  return checks;
}

namespace {

bool Selected(const Check& c, const std::vector<std::string>& only) {
  return only.empty() || std::find(only.begin(), only.end(), std::string(c.name())) != only.end();
}

bool HasInput(const Check& c, const LintInput& input) {
  return c.scope() == CheckScope::kRun ? input.world != nullptr : input.bundle.trace != nullptr;
}

}  // namespace

bool SelectsAny(CheckScope scope, const std::vector<std::string>& only) {
  for (const auto& c : AllChecks()) {
    if (c->scope() == scope && Selected(*c, only)) return true;
  }
  return false;
}

absl::Status CheckOnly(const std::vector<std::string>& only, const std::string& path, bool run_directory) {
  const std::vector<std::unique_ptr<Check>> checks = AllChecks();
  std::vector<std::string> names;
  for (const auto& c : checks) names.emplace_back(c->name());
  for (const std::string& name : only) {
    const auto found = std::find(names.begin(), names.end(), name);
    if (found == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("no check \"%s\" (checks: %s)", name, absl::StrJoin(names, ", ")));
    }
    if (!run_directory && checks[found - names.begin()]->scope() == CheckScope::kRun) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--only %s reads a run directory (world.json); %s is one bundle", name, path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Finding>> RunChecks(const LintInput& input, const std::vector<std::string>& only) {
  // A run check's name is valid here; it runs only when `input` has a run.
  MOERR_RETURN_IF_ERROR(CheckOnly(only, input.bundle.path, /*run_directory=*/true));
  const std::vector<std::unique_ptr<Check>> checks = AllChecks();
  std::vector<Finding> findings;
  for (const auto& c : checks) {
    if (!Selected(*c, only) || !HasInput(*c, input)) continue;
    MOERR_RETURN_IF_ERROR(Annotate(c->Run(input, findings), c->name()));
  }
  // Worst first; within a severity, in check order.
  std::stable_sort(findings.begin(), findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
  return findings;
}

}  // namespace moerr::analysis
