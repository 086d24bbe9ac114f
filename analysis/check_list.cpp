#include "analysis/check.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "support/enum_table.h"
#include "support/status.h"

namespace moerr::analysis {

// Defined in checks/, one file each.
std::unique_ptr<Check> MakeDtypeHeadroomCheck();
std::unique_ptr<Check> MakeHazardousPatternsCheck();
std::unique_ptr<Check> MakeRoutingFragilityCheck();
std::unique_ptr<Check> MakeLoadImbalanceCheck();
std::unique_ptr<Check> MakeOptimizerHazardsCheck();
std::unique_ptr<Check> MakeProxyPreservationCheck();

constexpr EnumName<Severity> kSeverities[] = {
    {Severity::kInfo, "info"}, {Severity::kWarning, "warning"}, {Severity::kError, "error"}};

absl::string_view SeverityName(Severity s) { return EnumNameOf(kSeverities, s, "?"); }

std::vector<std::unique_ptr<Check>> AllChecks() {
  std::vector<std::unique_ptr<Check>> checks;
  checks.push_back(MakeDtypeHeadroomCheck());
  checks.push_back(MakeHazardousPatternsCheck());
  checks.push_back(MakeRoutingFragilityCheck());
  checks.push_back(MakeLoadImbalanceCheck());
  checks.push_back(MakeOptimizerHazardsCheck());
  checks.push_back(MakeProxyPreservationCheck());
  return checks;
}

absl::StatusOr<std::vector<Finding>> RunChecks(const LintInput& input, const std::vector<std::string>& only) {
  std::vector<std::unique_ptr<Check>> checks = AllChecks();
  std::vector<std::string> names;
  for (const auto& c : checks) names.emplace_back(c->name());
  for (const std::string& name : only) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("no check \"%s\" (checks: %s)", name, absl::StrJoin(names, ", ")));
    }
  }
  std::vector<Finding> findings;
  for (const auto& c : checks) {
    if (!only.empty() && std::find(only.begin(), only.end(), std::string(c->name())) == only.end()) continue;
    MOERR_RETURN_IF_ERROR(Annotate(c->Run(input, findings), c->name()));
  }
  // Worst first; within a severity, in check order.
  std::stable_sort(findings.begin(), findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
  return findings;
}

}  // namespace moerr::analysis
