// The diff as one self-contained HTML page (support/html_page.h): a summary,
// a plot of each op's error along execution order, and the diverged ops,
// first divergence on top and marked.
#pragma once

#include "absl/strings/string_view.h"
#include "diff/trace_diff.h"
#include "support/html_page.h"

namespace moerr::diff {

// `report` aligns `a` with `b` (its op indices point into their ops).
HtmlPage DiffPage(const DiffReport& report, const formats::Trace& a, const formats::Trace& b, absl::string_view title);

}  // namespace moerr::diff
