// The table of faults.def's rows, and what reads it by name.
#include "moe/faults/fault_table.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "support/check.h"

namespace moerr::moe {

const std::vector<const FaultRow*>& FaultTable() {
  static const std::vector<const FaultRow*> rows = [] {
    std::vector<const FaultRow*> out = {
#define MOERR_FAULT(Name) &Name##Fault(),
#include "moe/faults/faults.def"
#undef MOERR_FAULT
    };
    // Row i is FaultKind i + 1 (kNone has none), with its scope's mechanism.
    for (size_t i = 0; i < out.size(); ++i) {
      const FaultRow& row = *out[i];
      MOERR_CHECK(row.kind == static_cast<FaultKind>(i + 1)) << "faults.def row " << i << ": " << row.name;
      MOERR_CHECK((row.scope == FaultScope::kProcess) == (row.inject != nullptr) &&
                  (row.scope == FaultScope::kRanks) == (row.observe != nullptr))
          << row.name << ": its scope's mechanism only";
    }
    return out;
  }();
  return rows;
}

const FaultRow& FaultRowOf(FaultKind kind) {
  const size_t i = static_cast<size_t>(kind);
  MOERR_CHECK(kind != FaultKind::kNone && i <= FaultTable().size()) << "no row for fault " << i;
  return *FaultTable()[i - 1];
}

const FaultRow* FindFault(absl::string_view name, FaultScope scope) {
  for (const FaultRow* row : FaultTable()) {
    if (row->scope == scope && row->name == name) return row;
  }
  return nullptr;
}

absl::StatusOr<FaultKind> ParseFault(const std::string& name) {
  if (name == "none") return FaultKind::kNone;
  if (const FaultRow* row = FindFault(name, FaultScope::kProcess)) return row->kind;
  std::vector<std::string> accepted = {"none"};
  for (FaultKind kind : AllFaults()) accepted.push_back(FaultName(kind));
  return absl::InvalidArgumentError(absl::StrCat("unknown fault \"", name, "\" (", absl::StrJoin(accepted, ", "), ")"));
}

std::string FaultName(FaultKind kind) {
  if (kind == FaultKind::kNone) return "none";
  const size_t i = static_cast<size_t>(kind);
  return i <= FaultTable().size() ? FaultTable()[i - 1]->name : "unknown";  // a corrupt value
}

std::vector<FaultKind> AllFaults(FaultScope scope) {
  std::vector<FaultKind> out;
  for (const FaultRow* row : FaultTable()) {
    if (row->scope == scope) out.push_back(row->kind);
  }
  return out;
}

std::string FaultsInWeights() {
  std::vector<std::string> names;
  for (const FaultRow* row : FaultTable()) {
    if (row->in_weights) names.push_back(row->name);
  }
  return absl::StrJoin(names, ", ");
}

bool OnsetFromDynamics(FaultKind kind) { return kind != FaultKind::kNone && FaultRowOf(kind).dynamics; }

std::string FaultHelp(FaultScope scope) {
  if (scope == FaultScope::kProcess) {
    std::string at_once = "none", later;
    for (FaultKind kind : AllFaults(scope)) {
      const FaultRow& row = FaultRowOf(kind);
      absl::StrAppend(row.dynamics ? &later : &at_once, row.dynamics && later.empty() ? "" : ", ", row.name);
    }
    return absl::StrCat("Fault to inject: ", at_once, ", and the dynamics faults (failing steps later) ", later);
  }
  std::vector<std::string> forms;
  for (FaultKind kind : AllFaults(scope)) {
    forms.push_back(absl::StrCat(FaultRowOf(kind).name, ":K (", FaultRowOf(kind).description, ")"));
  }
  return absl::StrCat("A multi-rank fault in step 0: ", absl::StrJoin(forms, ", "),
                      "; @N: at rank K's N-th collective after the rollout (N-th all_to_all of rows for corrupt), "
                      "from 0");
}

}  // namespace moerr::moe
