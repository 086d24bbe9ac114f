// The part of a report about one recorded step: its first overflow, per-op
// headroom against fp16, expert load per layer, and its lint findings.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "report/html_report.h"

namespace moerr::report {

// `path` names the bundle in the text. An error: the checks could not read it.
absl::Status AddStepSection(HtmlReport& page, const formats::BundleReader& reader, const std::string& path,
                            int64_t step, const formats::Trace& trace);

}  // namespace moerr::report
