#include "proxy/reduce.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "formats/module_path.h"
#include "proxy/passes/reduce_pass.h"
#include "proxy/step_bundle.h"
#include "proxy/surgery.h"
#include "replayer/model_replay.h"
#include "replayer/step_failure.h"
#include "support/filesystem.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

StepSize SizeOf(const StepBundle& b) {
  return StepSize{ParameterCount(b),  b.config.num_layers,  b.config.num_experts,
                  b.options.prompts,  b.options.group_size, moe::ResponseTokens(b.options, moe::AdditionTask())};
}

// The failure of step `step` of `reader` (trace `trace`) and the experts it is
// in; nullopt when it does not fail.
struct Located {
  ReduceFailure failure;
  std::vector<std::pair<int64_t, int64_t>> experts;
};
absl::StatusOr<std::optional<Located>> FindFailure(const formats::BundleReader& reader, int64_t step,
                                                   const formats::Trace& trace) {
  MOERR_ASSIGN_OR_RETURN(std::optional<ReduceFailure> failure, replayer::FindFailure(reader, step, trace));
  if (!failure) return std::nullopt;
  Located out{*std::move(failure), {}};
  for (const std::string& module : out.failure.modules) {
    if (auto e = formats::ExpertOf(module)) out.experts.push_back(*e);
  }
  return out;
}

// Writes `b` as WORK/candidate.moerr, model-replays it into
// WORK/replay.moerr and reads the replay back.
absl::StatusOr<formats::StepTrace> Replay(const StepBundle& b, const ReduceOptions& options) {
  const std::string candidate_path = options.work_dir + "/candidate.moerr";
  MOERR_RETURN_IF_ERROR(WriteStepBundle(b, candidate_path));
  MOERR_ASSIGN_OR_RETURN(auto cand_reader, formats::BundleReader::Open(candidate_path));
  replayer::ModelReplayOptions replay_options;
  replay_options.record_path = options.work_dir + "/replay.moerr";
  replay_options.overwrite = true;
  absl::StatusOr<replayer::ReplayedStep> replayed = replayer::ReplayModelStepTrace(*cand_reader, b.step, replay_options);
  if (!replayed.ok()) return Annotate(replayed.status(), "model replay of " + candidate_path);
  return std::move(replayed->recording);
}

// The step to reduce: the first that fails (or options.step), read once,
// with its failure. A step without ops (a proxy's, or an earlier
// reduction's) fails as its model replay does.
struct FailingStep {
  StepBundle bundle;
  Located found;
};
absl::StatusOr<FailingStep> FindFailingStep(const formats::BundleReader& reader, const ReduceOptions& options) {
  for (int64_t step : options.step >= 0 ? std::vector<int64_t>{options.step} : reader.CompleteSteps()) {
    absl::StatusOr<formats::Trace> trace = formats::ReadTrace(reader, step);
    if (!trace.ok()) return Annotate(trace.status(), absl::StrFormat("%s, step %d", options.source, step));
    std::optional<Located> found;
    std::optional<StepBundle> bundle;
    if (trace->ops.empty()) {
      MOERR_ASSIGN_OR_RETURN(bundle, LoadStepBundle(reader, step, *trace, options.source));
      absl::StatusOr<formats::StepTrace> replayed = Replay(*bundle, options);
      if (!replayed.ok()) return Annotate(replayed.status(), absl::StrFormat("%s, step %d", options.source, step));
      MOERR_ASSIGN_OR_RETURN(found, FindFailure(*replayed->reader, step, replayed->trace));
    } else {
      MOERR_ASSIGN_OR_RETURN(found, FindFailure(reader, step, *trace));
      if (found) {
        MOERR_ASSIGN_OR_RETURN(bundle, LoadStepBundle(reader, step, *trace, options.source));
      }
    }
    if (found) return FailingStep{*std::move(bundle), *std::move(found)};
  }
  return absl::FailedPreconditionError(
      options.step >= 0
          ? absl::StrFormat("%s: step %d does not fail: it has no overflow and no lint warning", options.source,
                            options.step)
          : options.source + ": no recorded step fails: none has an overflow or a lint warning");
}

}  // namespace

absl::StatusOr<ReduceReport> Reduce(const formats::BundleReader& reader, const ReduceOptions& options,
                                    const ReduceProgress& progress) {
  if (options.out_path.empty() || options.work_dir.empty()) {
    return absl::InvalidArgumentError("reduce: an output bundle and a work directory are required");
  }
  MOERR_RETURN_IF_ERROR(MakeDirectory(options.work_dir));
  const auto start = std::chrono::steady_clock::now();
  MOERR_ASSIGN_OR_RETURN(FailingStep failing, FindFailingStep(reader, options));
  ReduceReport report;
  report.step = failing.bundle.step;
  report.failure = failing.found.failure;
  StepBundle current = std::move(failing.bundle);
  current.implicated = failing.found.experts;
  report.before = SizeOf(current);

  // Whether `candidate`'s replay fails as the step does.
  auto same_failure = [&](const StepBundle& candidate) -> absl::StatusOr<bool> {
    ++report.tried;
    MOERR_ASSIGN_OR_RETURN(formats::StepTrace replayed, Replay(candidate, options));
    MOERR_ASSIGN_OR_RETURN(replayer::Reproduction shown,
                           replayer::Reproduces(*replayed.reader, replayed.step, replayed.trace, report.failure));
    return shown == replayer::Reproduction::kSamePlace;
  };
  const std::vector<std::unique_ptr<ReducePass>> passes = AllReducePasses();
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (const auto& pass : passes) {
      for (Candidate& candidate : pass->Propose(current)) {
        if (progress) progress(report.tried, std::string(pass->name()));
        absl::StatusOr<bool> same = same_failure(candidate.bundle);
        if (!same.ok()) {
          return Annotate(same.status(), absl::StrFormat("reduce pass %s, candidate with %s", pass->name(),
                                                         candidate.removed));
        }
        if (!*same) continue;
        report.accepted.push_back({std::string(pass->name()), candidate.removed});
        current = std::move(candidate.bundle);
        progressed = true;
        break;
      }
    }
  }
  MOERR_RETURN_IF_ERROR(WriteStepBundle(current, options.out_path));
  report.after = SizeOf(current);
  report.seconds = SecondsSince(start);
  return report;
}

}  // namespace moerr::proxy
