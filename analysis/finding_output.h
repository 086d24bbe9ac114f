// A lint Finding as `moerr lint` prints it, as text and as JSON.
#pragma once

#include <vector>

#include "analysis/check.h"
#include "llvm/Support/JSON.h"

namespace moerr::analysis {

// {"check", "severity", "step", "where", "message", "numbers"}, then
// "op_index", "op", "phase" for an op, "next" and "rank" when set.
llvm::json::Object FindingJson(const Finding& f);

// Two or three lines: severity, check and where; the message; "next: ...".
void PrintFinding(const Finding& f);

// Every finding under a "step N:" line per step (in the order given), then
// the counts by severity.
void PrintFindings(const std::vector<Finding>& all);

}  // namespace moerr::analysis
