// The diff as one self-contained HTML page (support/html_page.h): a summary,
// plots of each op's introduced and inherited error and of its observed
// error along execution order, and the diverged ops,
// first divergence on top and marked.
#pragma once

#include "absl/strings/string_view.h"
#include "diff/precision_diff.h"
#include "diff/trace_diff.h"
#include "support/html_page.h"

namespace moerr::diff {

// `precision` judges `a` against `b` (its op indices point into their ops):
// its introduced and inherited errors are plotted above the observed ones.
HtmlPage DiffPage(const PrecisionDiff& precision, const formats::Trace& a, const formats::Trace& b,
                  absl::string_view title);

}  // namespace moerr::diff
