#include "replayer/step_failure.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "formats/module_path.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

// Warnings and errors of `check` (every check when empty), worst first.
absl::StatusOr<std::vector<analysis::Finding>> Warnings(const formats::BundleReader& reader, int64_t step,
                                                        const formats::Trace& trace, const std::string& check) {
  const analysis::LintInput input{analysis::StepView{&reader, "", step, &trace}, std::nullopt};
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> findings,
                         analysis::RunChecks(input, check.empty() ? std::vector<std::string>{}
                                                                  : std::vector<std::string>{check}));
  std::vector<analysis::Finding> out;
  for (analysis::Finding& f : findings) {
    if (f.severity != analysis::Severity::kInfo) out.push_back(std::move(f));
  }
  return out;
}

Failure FindingFailure(const analysis::Finding& f) {
  // "layer 3" -> "layer", a module path -> its class; "(no module)" stays.
  return {f.check,
          f.phase,
          absl::StartsWith(f.where, "(") ? f.where : formats::ModuleClass(f.where),
          absl::StrFormat("%s %s in %s: %s", analysis::SeverityName(f.severity), f.check, f.where, f.message),
          {f.where}};
}

}  // namespace

absl::StatusOr<StepTrace> OpenStepTrace(const std::string& path, int64_t step) {
  StepTrace out;
  out.path = path;
  MOERR_ASSIGN_OR_RETURN(out.reader, formats::BundleReader::Open(path));
  if (step < 0) {
    const std::vector<int64_t> complete = out.reader->CompleteSteps();
    if (complete.empty()) return absl::NotFoundError(path + " has no complete step");
    step = complete.front();
  }
  out.step = step;
  absl::StatusOr<formats::Trace> trace = formats::ReadTrace(*out.reader, step);
  if (!trace.ok()) return Annotate(trace.status(), absl::StrFormat("%s, step %d", path, step));
  out.trace = *std::move(trace);
  return out;
}

absl::StatusOr<ReplayedStep> ReplayModelStepTrace(const formats::BundleReader& reader, int64_t step,
                                                  const ModelReplayOptions& options) {
  ReplayedStep out;
  MOERR_ASSIGN_OR_RETURN(out.report, ReplayModelStep(reader, step, options));
  MOERR_ASSIGN_OR_RETURN(out.recording, OpenStepTrace(options.record_path, step));
  return out;
}

Failure OverflowFailure(const analysis::FirstOverflow& first) {
  Failure out{"overflow", std::string(formats::PhaseName(first.op->phase)), formats::ModuleClass(first.op->module),
              absl::StrFormat("first overflow at op %zu, %s in %s (%s)", first.op_index, first.op->name,
                              first.op->module, formats::PhaseName(first.op->phase)),
              {}};
  for (const formats::OpEvent* op : {first.op, first.forward_op}) {
    if (op != nullptr) out.modules.push_back(op->module);
  }
  return out;
}

absl::StatusOr<std::optional<Failure>> FindFailure(const formats::BundleReader& reader, int64_t step,
                                                   const formats::Trace& trace, const std::string& check) {
  if (check.empty()) {
    if (const auto first = analysis::FindFirstOverflow(trace)) return OverflowFailure(*first);
  }
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> warnings, Warnings(reader, step, trace, check));
  if (warnings.empty()) return std::nullopt;
  return FindingFailure(warnings.front());
}

absl::StatusOr<std::vector<Failure>> FailuresOf(const formats::BundleReader& reader, int64_t step,
                                                const formats::Trace& trace, const std::string& kind) {
  std::vector<Failure> out;
  if (kind == "overflow") {
    if (const auto first = analysis::FindFirstOverflow(trace)) out.push_back(OverflowFailure(*first));
    return out;
  }
  MOERR_ASSIGN_OR_RETURN(const std::vector<analysis::Finding> warnings, Warnings(reader, step, trace, kind));
  for (const analysis::Finding& f : warnings) out.push_back(FindingFailure(f));
  return out;
}

Reproduction Compare(const std::optional<Failure>& shown, const Failure& failure) {
  if (!shown || shown->kind != failure.kind) return Reproduction::kNo;
  const bool same_place = shown->phase == failure.phase && shown->module_class == failure.module_class;
  return same_place ? Reproduction::kSamePlace : Reproduction::kSameKind;
}

absl::StatusOr<Reproduction> Reproduces(const formats::BundleReader& reader, int64_t step,
                                        const formats::Trace& trace, const Failure& failure) {
  if (failure.kind == "overflow") {
    const auto first = analysis::FindFirstOverflow(trace);
    return Compare(first ? std::optional<Failure>(OverflowFailure(*first)) : std::nullopt, failure);
  }
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> warnings, Warnings(reader, step, trace, failure.kind));
  Reproduction best = Reproduction::kNo;
  for (const analysis::Finding& f : warnings) best = std::max(best, Compare(FindingFailure(f), failure));
  return best;
}

}  // namespace moerr::replayer
