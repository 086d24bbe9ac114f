#include "proxy/reduce.h"

#include <sys/stat.h>

#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "analysis/first_overflow.h"
#include "proxy/passes/reduce_pass.h"
#include "proxy/step_bundle.h"
#include "proxy/surgery.h"
#include "replayer/model_replay.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

// The passes, in the order each round tries them: the model first (it is
// what costs accelerators), then the batch.
std::vector<std::unique_ptr<ReducePass>> Passes() {
  std::vector<std::unique_ptr<ReducePass>> passes;
  passes.push_back(MakePruneExpertsPass());
  passes.push_back(MakePruneLayersPass());
  passes.push_back(MakeTruncateTokensPass());
  passes.push_back(MakeShrinkBatchPass());
  return passes;
}

StepSize SizeOf(const StepBundle& b) {
  return StepSize{ParameterCount(b),  b.config.num_layers,  b.config.num_experts,
                  b.options.prompts,  b.options.group_size, moe::ResponseTokens(b.options, moe::AdditionTask())};
}

// Warnings and errors of `check` (every check when empty), worst first.
absl::StatusOr<std::vector<analysis::Finding>> Warnings(const formats::BundleReader& reader, int64_t step,
                                                        const formats::Trace& trace, const std::string& check) {
  analysis::LintInput input{analysis::StepView{&reader, "", step, &trace}, std::nullopt};
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> findings,
                         analysis::RunChecks(input, check.empty() ? std::vector<std::string>{}
                                                                  : std::vector<std::string>{check}));
  std::vector<analysis::Finding> out;
  for (analysis::Finding& f : findings) {
    if (f.severity != analysis::Severity::kInfo) out.push_back(std::move(f));
  }
  return out;
}

ReduceFailure FindingFailure(const analysis::Finding& f) {
  // "layer 3" -> "layer", a module path -> its class; "(no module)" stays.
  return {f.check, f.phase, absl::StartsWith(f.where, "(") ? f.where : analysis::ModuleClass(f.where),
          absl::StrFormat("%s %s in %s: %s", analysis::SeverityName(f.severity), f.check, f.where, f.message)};
}

bool Same(const ReduceFailure& a, const ReduceFailure& b) {
  return a.kind == b.kind && a.phase == b.phase && a.module_class == b.module_class;
}

// How step `step` of `reader` fails, and the experts the failure is in;
// nullopt when it does not fail.
struct Located {
  ReduceFailure failure;
  std::vector<std::pair<int64_t, int64_t>> experts;
};
absl::StatusOr<std::optional<Located>> FindFailure(const formats::BundleReader& reader, int64_t step,
                                                   const formats::Trace& trace) {
  if (const auto first = analysis::FindFirstOverflow(trace)) {
    Located out;
    out.failure = {"overflow", std::string(formats::PhaseName(first->op->phase)),
                   analysis::ModuleClass(first->op->module),
                   absl::StrFormat("first overflow at op %zu, %s in %s (%s)", first->op_index, first->op->name,
                                   first->op->module, formats::PhaseName(first->op->phase))};
    for (const formats::OpEvent* op : {first->op, first->forward_op}) {
      if (op == nullptr) continue;
      if (auto e = ExpertOf(op->module)) out.experts.push_back(*e);
    }
    return out;
  }
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> warnings, Warnings(reader, step, trace, ""));
  if (warnings.empty()) return std::nullopt;
  Located out{FindingFailure(warnings.front()), {}};
  if (auto e = ExpertOf(warnings.front().where)) out.experts.push_back(*e);
  return out;
}

// Whether step `step` of `reader` (a candidate's replay) fails as `failure`:
// its first overflow, or any of its warnings of the same check.
absl::StatusOr<bool> Reproduces(const formats::BundleReader& reader, int64_t step, const ReduceFailure& failure) {
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
  if (failure.kind == "overflow") {
    const auto first = analysis::FindFirstOverflow(trace);
    return first && formats::PhaseName(first->op->phase) == failure.phase &&
           analysis::ModuleClass(first->op->module) == failure.module_class;
  }
  MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> warnings, Warnings(reader, step, trace, failure.kind));
  for (const analysis::Finding& f : warnings) {
    if (Same(FindingFailure(f), failure)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<ReduceReport> Reduce(const formats::BundleReader& reader, const ReduceOptions& options,
                                    const ReduceProgress& progress) {
  if (options.out_path.empty() || options.work_dir.empty()) {
    return absl::InvalidArgumentError("reduce: an output bundle and a work directory are required");
  }
  if (::mkdir(options.work_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", options.work_dir, std::strerror(errno)));
  }
  const auto start = std::chrono::steady_clock::now();
  ReduceReport report;
  // Writes `b` as a bundle, model-replays it, and opens the replay's recording.
  const std::string candidate_path = options.work_dir + "/candidate.moerr";
  auto replay = [&](const StepBundle& b) -> absl::StatusOr<std::unique_ptr<formats::BundleReader>> {
    MOERR_RETURN_IF_ERROR(WriteStepBundle(b, candidate_path));
    MOERR_ASSIGN_OR_RETURN(auto cand_reader, formats::BundleReader::Open(candidate_path));
    replayer::ModelReplayOptions replay_options;
    replay_options.record_path = options.work_dir + "/replay.moerr";
    replay_options.overwrite = true;
    MOERR_RETURN_IF_ERROR(replayer::ReplayModelStep(*cand_reader, b.step, replay_options).status());
    return formats::BundleReader::Open(replay_options.record_path);
  };

  // The failure: the first step that fails. A step without ops (a proxy's,
  // or an earlier reduction's) fails as its model replay does.
  std::optional<Located> found;
  std::optional<StepBundle> current;
  for (int64_t step : options.step >= 0 ? std::vector<int64_t>{options.step} : reader.CompleteSteps()) {
    MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
    if (trace.ops.empty()) {
      MOERR_ASSIGN_OR_RETURN(current, LoadStepBundle(reader, step));
      MOERR_ASSIGN_OR_RETURN(auto replayed, replay(*current));
      MOERR_ASSIGN_OR_RETURN(trace, formats::ReadTrace(*replayed, step));
      MOERR_ASSIGN_OR_RETURN(found, FindFailure(*replayed, step, trace));
    } else {
      MOERR_ASSIGN_OR_RETURN(found, FindFailure(reader, step, trace));
      current.reset();
    }
    if (found) {
      report.step = step;
      break;
    }
  }
  if (!found) {
    return absl::FailedPreconditionError(
        options.step >= 0 ? absl::StrFormat("step %d does not fail: it has no overflow and no lint warning",
                                            options.step)
                          : "no recorded step fails: none has an overflow or a lint warning");
  }
  report.failure = found->failure;
  if (!current) {
    MOERR_ASSIGN_OR_RETURN(current, LoadStepBundle(reader, report.step));
  }
  current->implicated = found->experts;
  report.before = SizeOf(*current);

  auto same_failure = [&](const StepBundle& candidate) -> absl::StatusOr<bool> {
    ++report.tried;
    MOERR_ASSIGN_OR_RETURN(auto replayed, replay(candidate));
    return Reproduces(*replayed, candidate.step, report.failure);
  };

  const std::vector<std::unique_ptr<ReducePass>> passes = Passes();
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (const auto& pass : passes) {
      for (Candidate& candidate : pass->Propose(*current)) {
        if (progress) progress(report.tried, std::string(pass->name()));
        MOERR_ASSIGN_OR_RETURN(bool same, same_failure(candidate.bundle));
        if (!same) continue;
        report.accepted.push_back({std::string(pass->name()), candidate.removed});
        current = std::move(candidate.bundle);
        progressed = true;
        break;
      }
    }
  }
  MOERR_RETURN_IF_ERROR(WriteStepBundle(*current, options.out_path));
  report.after = SizeOf(*current);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace moerr::proxy
