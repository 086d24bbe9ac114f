// The verdict at the top of a report: for the first step with a non-finite
// value, the op that caused it, the first non-finite op, the phase and the
// command to run next; else that every output was finite.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/overflow_cause.h"
#include "formats/trace.h"
#include "support/html_page.h"

namespace moerr::report {

// Sets the page's verdict from `found`, the overflow of step `step` (its
// trace `trace`, which `found` points into) of the bundle at `path`, unless
// the page has a verdict already (an earlier step's comes first).
// `replayable`: the bundle holds what a replay needs (not a stats one), so
// precision bisect can run on it.
void AddOverflowVerdict(HtmlPage& page, const std::string& path, int64_t step, const formats::Trace& trace,
                        const analysis::OverflowCause& found, bool replayable);

// The verdict of a page whose `steps` kept every output finite.
void AddFiniteVerdict(HtmlPage& page, const std::string& path, const std::vector<int64_t>& steps);

}  // namespace moerr::report
