#include "proxy/reduce.h"

#include <sys/stat.h>

#include <chrono>

#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "proxy/passes/reduce_pass.h"
#include "proxy/step_bundle.h"
#include "proxy/surgery.h"
#include "replayer/model_replay.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

// The passes, in the order each round tries them.
std::vector<std::unique_ptr<ReducePass>> Passes() {
  std::vector<std::unique_ptr<ReducePass>> passes;
  passes.push_back(MakePruneExpertsPass());
  passes.push_back(MakePruneLayersPass());
  passes.push_back(MakeShrinkBatchPass());
  return passes;
}

struct Failure {
  std::string phase, module_class;
};

}  // namespace

absl::StatusOr<ReduceReport> Reduce(const formats::BundleReader& reader, const ReduceOptions& options,
                                    const ReduceProgress& progress) {
  if (options.out_path.empty() || options.work_dir.empty()) {
    return absl::InvalidArgumentError("reduce: an output bundle and a work directory are required");
  }
  if (::mkdir(options.work_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrFormat("cannot create %s: %s", options.work_dir, std::strerror(errno)));
  }
  const auto start = std::chrono::steady_clock::now();
  ReduceReport report;
  // The failure: the recorded step's first overflow.
  std::optional<analysis::FirstOverflow> first;
  formats::Trace trace;
  for (int64_t step : options.step >= 0 ? std::vector<int64_t>{options.step} : reader.CompleteSteps()) {
    MOERR_ASSIGN_OR_RETURN(trace, formats::ReadTrace(reader, step));
    first = analysis::FindFirstOverflow(trace);
    if (first) {
      report.step = step;
      break;
    }
  }
  if (!first) {
    return absl::FailedPreconditionError(
        "no recorded step overflows: reduce keeps a failure's first overflow, and there is none (moerr lint names "
        "other failures)");
  }
  report.phase = std::string(formats::PhaseName(first->op->phase));
  report.module_class = analysis::ModuleClass(first->op->module);

  MOERR_ASSIGN_OR_RETURN(StepBundle current, LoadStepBundle(reader, report.step));
  for (const formats::OpEvent* op : {first->op, first->forward_op}) {
    if (op == nullptr) continue;
    if (auto e = ExpertOf(op->module)) current.implicated.push_back(*e);
  }
  report.params_before = ParameterCount(current);
  report.layers_before = current.config.num_layers;
  report.experts_before = current.config.num_experts;
  report.prompts_before = current.options.prompts;

  const std::string candidate_path = options.work_dir + "/candidate.moerr";
  auto same_failure = [&](const StepBundle& candidate) -> absl::StatusOr<bool> {
    ++report.tried;
    MOERR_RETURN_IF_ERROR(WriteStepBundle(candidate, candidate_path));
    MOERR_ASSIGN_OR_RETURN(auto cand_reader, formats::BundleReader::Open(candidate_path));
    replayer::ModelReplayOptions replay;
    replay.record_path = options.work_dir + "/replay.moerr";
    replay.overwrite = true;
    MOERR_RETURN_IF_ERROR(replayer::ReplayModelStep(*cand_reader, candidate.step, replay).status());
    MOERR_ASSIGN_OR_RETURN(auto replayed, formats::BundleReader::Open(replay.record_path));
    MOERR_ASSIGN_OR_RETURN(formats::Trace t, formats::ReadTrace(*replayed, candidate.step));
    const auto f = analysis::FindFirstOverflow(t);
    return f && formats::PhaseName(f->op->phase) == report.phase &&
           analysis::ModuleClass(f->op->module) == report.module_class;
  };

  const std::vector<std::unique_ptr<ReducePass>> passes = Passes();
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (const auto& pass : passes) {
      for (Candidate& candidate : pass->Propose(current)) {
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
  MOERR_RETURN_IF_ERROR(WriteStepBundle(current, options.out_path));
  report.params_after = ParameterCount(current);
  report.layers_after = current.config.num_layers;
  report.experts_after = current.config.num_experts;
  report.prompts_after = current.options.prompts;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace moerr::proxy
