// The verdict at the top of a report: for the first step with a non-finite
// value, the op that caused it, the first non-finite op, the phase and the
// command to run next; else that every output was finite.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/trace.h"
#include "report/html_report.h"

namespace moerr::report {

// Sets the page's verdict from step `step` of the bundle at `path` when the
// step has a non-finite output and the page has no verdict yet (an earlier
// step's comes first). Returns whether the step has a non-finite output.
// `replayable`: the bundle holds what a replay needs (not a stats one), so
// precision bisect can run on it.
bool AddOverflowVerdict(HtmlReport& page, const std::string& path, int64_t step, const formats::Trace& trace,
                        bool replayable);

// The verdict of a page whose `steps` kept every output finite.
void AddFiniteVerdict(HtmlReport& page, const std::string& path, const std::vector<int64_t>& steps);

}  // namespace moerr::report
