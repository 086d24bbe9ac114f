// The part of a report about one recorded step: its first overflow, per-op
// headroom against each output's own dtype (with would-fit overlays),
// expert load per layer, and its lint findings. The first step with a
// non-finite value gives the page its verdict.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "support/html_page.h"

namespace moerr::report {

// `path` names the bundle in the text; `would_fit` (kF16, kBF16) are the
// headroom plot's overlays. An error: the checks could not read it.
absl::Status AddStepSection(HtmlPage& page, const formats::BundleReader& reader, const std::string& path,
                            int64_t step, const formats::Trace& trace,
                            const std::vector<formats::DType>& would_fit = {});

// The loop's named metrics (the steps' "outcome" annotations) as one
// trajectory each; nothing when no step has them.
absl::Status AddMetricsSection(HtmlPage& page, const formats::BundleReader& reader);

}  // namespace moerr::report
