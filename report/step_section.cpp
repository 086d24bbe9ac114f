#include "report/step_section.h"

#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "analysis/first_overflow.h"
#include "report/step_figures.h"
#include "support/status.h"

namespace moerr::report {

absl::Status AddStepSection(HtmlReport& page, const formats::BundleReader& reader, const std::string& path,
                            int64_t step, const formats::Trace& trace) {
  page.Heading(absl::StrFormat("Step %d of %s", step, path));
  const auto first = analysis::FindFirstOverflow(trace);
  page.Paragraph(first ? absl::StrFormat("%zu ops recorded. The first op whose inputs were finite and whose output "
                                         "was not: op %zu, %s in %s (%s); %llu of %llu values +Inf, %llu -Inf, %llu "
                                         "NaN.",
                                         trace.ops.size(), first->op_index, first->op->name, first->op->module,
                                         formats::PhaseName(first->op->phase), first->fingerprint.pos_inf,
                                         first->fingerprint.numel, first->fingerprint.neg_inf, first->fingerprint.nan)
                       : absl::StrFormat("%zu ops recorded; every output is finite.", trace.ops.size()));
  page.Figure(HeadroomFigure(trace, 65504.0, "fp16"),
              "Each dot is an op's least headroom: how many doublings its largest output could take before leaving "
              "fp16's range. Dots at the bottom are non-finite outputs.");
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

}  // namespace moerr::report
