#include "replayer/step_failure.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "formats/module_path.h"
#include "replayer/model_replay.h"
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

// Which kind of warning of its check a finding is. The checks give one
// Finding type for all their warnings; the message's fixed opening names it
// (analysis/checks/optimizer_hazards.cpp, hazardous_patterns.cpp).
std::string RuleOf(const analysis::Finding& f) {
  const absl::string_view m = f.message;
  if (f.check == "optimizer-hazards") {
    if (absl::StartsWith(m, "the update was skipped")) return "skipped-update";
    if (absl::StartsWith(m, "the loss scale has fallen")) return "loss-scale-fallen";
    if (absl::StrContains(m, "the update was lost")) return "lost-update";
    if (absl::StrContains(m, "eps-dominated")) return "adam-eps";
  } else if (f.check == "hazardous-patterns") {
    if (absl::StrContains(m, "autocast dtypes")) return "mixed-autocast";
    if (absl::StartsWith(m, "exp of")) return "exp-range";
    if (absl::StartsWith(m, "pow(")) return "pow-range";
    if (absl::StartsWith(m, "divisor")) return "division";
    if (absl::StrContains(m, " values per output")) return "long-reduction";
    if (absl::StrContains(m, "softmax")) return "softmax-16bit";
  }
  return f.check;
}

// load-imbalance: the busiest expert's share of the layer's slots.
std::optional<double> MeasureOf(const analysis::Finding& f) {
  if (f.check != "load-imbalance") return std::nullopt;
  const auto busiest = f.numbers.getInteger("busiest_expert");
  const auto slots = f.numbers.getInteger("slots");
  const llvm::json::Array* loads = f.numbers.getArray("tokens_per_expert");
  if (!busiest || !slots || *slots <= 0 || loads == nullptr || *busiest < 0 ||
      *busiest >= static_cast<int64_t>(loads->size())) {
    return std::nullopt;
  }
  return double((*loads)[static_cast<size_t>(*busiest)].getAsInteger().getValueOr(0)) / double(*slots);
}

Failure FindingFailure(const analysis::Finding& f) {
  // "layer 3" -> "layer", a module path -> its class; "(no module)" stays.
  return {f.check,
          f.phase,
          absl::StartsWith(f.where, "(") ? f.where : formats::ModuleClass(f.where),
          absl::StrFormat("%s %s in %s: %s", analysis::SeverityName(f.severity), f.check, f.where, f.message),
          {f.where},
          RuleOf(f),
          MeasureOf(f)};
}

}  // namespace

absl::StatusOr<ReplayedStep> ReplayModelStepTrace(const formats::BundleReader& reader, int64_t step,
                                                  const ModelReplayOptions& options) {
  ReplayedStep out;
  MOERR_ASSIGN_OR_RETURN(out.report, ReplayModelStep(reader, step, options));
  MOERR_ASSIGN_OR_RETURN(out.recording, formats::OpenStepTrace(options.record_path, step));
  return out;
}

Failure OverflowFailure(const analysis::FirstOverflow& first) {
  Failure out{"overflow", std::string(formats::PhaseName(first.op->phase)), formats::ModuleClass(first.op->module),
              absl::StrFormat("first overflow at op %zu, %s in %s (%s)", first.op_index, first.op->name,
                              first.op->module, formats::PhaseName(first.op->phase)),
              {},
              "overflow",
              std::nullopt};
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
  // Another warning of the same check (a loss-scaler skip for a lost update,
  // Adam's eps for either) is another failure.
  if (!failure.rule.empty() && shown->rule != failure.rule) return Reproduction::kNo;
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
