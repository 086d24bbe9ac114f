// The diff as one self-contained HTML page (no scripts, no external files):
// a summary, an SVG plot of each op's error along execution order, and the
// diverged ops, first divergence on top.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "diff/trace_diff.h"

namespace moerr::diff {

std::string HtmlReport(const DiffReport& report, const formats::Trace& a, const formats::Trace& b,
                       absl::string_view title);

}  // namespace moerr::diff
