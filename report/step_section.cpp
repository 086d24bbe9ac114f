#include "report/step_section.h"

#include <map>
#include <optional>

#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "analysis/overflow_cause.h"
#include "formats/annotations.h"
#include "formats/bundle_summary.h"
#include "formats/raised_step.h"
#include "report/step_figures.h"
#include "report/verdict.h"
#include "support/status.h"

namespace moerr::report {

absl::Status AddStepSection(HtmlPage& page, const formats::BundleReader& reader, const std::string& path,
                            int64_t step, const formats::Trace& trace,
                            const std::vector<formats::DType>& would_fit) {
  // A step left by an exception: the exception is the first fact.
  MOERR_ASSIGN_OR_RETURN(const std::optional<formats::RaisedStep> raised, formats::ReadRaisedStep(reader, step));
  if (raised && !page.has_verdict()) {
    page.Verdict(absl::StrFormat("Step %d raised %s", step, raised->type),
                 {{"exception", raised->Headline()},
                  {"next", absl::StrFormat("moerr bisect %s --step %d", path, step), true}},
                 /*failed=*/true);
  }
  // The step's overflow, found once for the verdict, the text and the figure.
  const std::optional<analysis::OverflowCause> found = analysis::FindOverflowCause(trace);
  const analysis::FirstOverflow* first = found ? &found->first : nullptr;
  if (found) AddOverflowVerdict(page, path, step, trace, *found, formats::HoldsReplayableValues(reader));
  page.Heading(absl::StrFormat("Step %d of %s", step, path));
  if (raised) {
    page.Paragraph("The step raised " + raised->Headline() + ". The ops below are those recorded before it.");
    if (!raised->traceback.empty()) page.Preformatted(raised->traceback);
  }
  page.Paragraph(first ? absl::StrFormat("%zu ops recorded. The first op whose inputs were finite and whose output "
                                         "was not: op %zu, %s in %s (%s); %llu of %llu values +Inf, %llu -Inf, %llu "
                                         "NaN.",
                                         trace.ops.size(), first->op_index, first->op->name, first->op->module,
                                         formats::PhaseName(first->op->phase), first->fingerprint.pos_inf,
                                         first->fingerprint.numel, first->fingerprint.neg_inf, first->fingerprint.nan)
                       : absl::StrFormat("%zu ops recorded; every output is finite.", trace.ops.size()));
  std::string caption =
      "Each dot is an op's least headroom: how many doublings its largest floating output could take before "
      "leaving the range of its own dtype (an fp32 output: fp32's). Dots at the bottom are non-finite outputs; "
      "integer and bool outputs have no headroom and are left out; f64 outputs (about 1000 bits) sit on the top "
      "edge. Hover over a dot for its op.";
  if (!would_fit.empty()) {
    caption += " The pale overlays ask: would the same outputs fit if they were held in a 16-bit format?";
  }
  page.Figure(HeadroomFigure(trace, first, would_fit), caption);
  if (const std::string load = ExpertLoadFigure(trace); !load.empty()) {
    page.Figure(load, "Darker: busier. A number is a load of at least twice the fair share.");
  }
  analysis::LintInput input{analysis::StepView{&reader, path, step, &trace}, std::nullopt};
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> findings, analysis::RunChecks(input));
  std::vector<std::vector<std::string>> rows;
  for (const analysis::Finding& f : findings) {
    rows.push_back({std::string(analysis::SeverityName(f.severity)), f.check,
                    f.op_index >= 0 ? absl::StrFormat("op %d %s in %s (%s)", f.op_index, f.op, f.where, f.phase)
                                    : f.where,
                    f.message, f.next});
  }
  page.Paragraph(absl::StrFormat("moerr lint: %zu findings.", findings.size()));
  if (!rows.empty()) page.Table({"severity", "check", "where", "finding", "next"}, rows);
  return absl::OkStatus();
}

absl::Status AddMetricsSection(HtmlPage& page, const formats::BundleReader& reader) {
  MOERR_ASSIGN_OR_RETURN(const auto outcomes, formats::ReadOutcomes(reader));
  if (outcomes.empty()) return absl::OkStatus();
  // One trajectory per metric, over the steps that named it.
  std::map<std::string, std::vector<double>> series;
  for (const auto& [step, metrics] : outcomes) {
    for (const auto& [name, value] : metrics) series[name].push_back(value);
  }
  page.Heading("Metrics");
  page.Paragraph(absl::StrFormat("The loop's metrics (rec.outcome) over the %zu steps that named them.",
                                 outcomes.size()));
  for (const auto& [name, values] : series) page.Figure(TrajectoryFigure(name, "recorded", values, "", {}), name);
  return absl::OkStatus();
}

}  // namespace moerr::report
