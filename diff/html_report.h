// The HTML diff was diff::HtmlReport; it is now DiffPage (diff_page.h). This
// forward remains only for the tools/ file that still includes this header,
// and goes once it includes diff/diff_page.h.
#pragma once

#include <string>

#include "diff/diff_page.h"

namespace moerr::diff {

inline std::string HtmlReport(const DiffReport& report, const formats::Trace& a, const formats::Trace& b,
                              absl::string_view title) {
  return DiffPage(report, a, b, title).Render();
}

}  // namespace moerr::diff
