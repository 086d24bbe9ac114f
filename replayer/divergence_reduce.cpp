#include "replayer/divergence_reduce.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/strings/str_format.h"
#include "diff/precision_diff.h"
#include "formats/bundle_reader.h"
#include "recorder/hooks/torch_boundary.h"
#include "replayer/introduced_error.h"
#include "replayer/program_replay.h"
#include "replayer/repro_script.h"
#include "replayer/step_cut.h"
#include "support/check.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

using Clock = std::chrono::steady_clock;

std::string Where(const formats::StepTrace& s) { return absl::StrFormat("%s, step %d", s.path, s.step); }

// The op the diff's headline names (an index into `judged.ops`), or an error
// saying why the headline is not an op of `bundle` to reduce to.
absl::StatusOr<size_t> Culprit(const diff::PrecisionDiff& judged, const formats::StepTrace& bundle,
                               const formats::StepTrace& reference) {
  const std::string pair = absl::StrFormat("%s against %s", Where(bundle), Where(reference));
  if (judged.estimated) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: introduced error could only be estimated (%s); the divergence reduce keeps a measured one", pair,
        judged.estimated_because.empty() ? "no side replayed isolated" : judged.estimated_because));
  }
  if (!judged.Found()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: no op introduces error beyond its budget (moerr diff %s %s): there is no divergence to reduce", pair,
        reference.path, bundle.path));
  }
  if (judged.ProgramFirst()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the first difference is the program's (other ops called; moerr diff %s %s names them), not an op's "
        "error, and a repro of one op cannot show it",
        pair, reference.path, bundle.path));
  }
  const diff::PrecisionOp& p = judged.ops[*judged.first_op];
  MOERR_CHECK(p.a >= 0 && p.b >= 0);
  const formats::OpEvent& op = bundle.trace.ops[static_cast<size_t>(p.b)];
  if (p.sides[1].Beyond()) return *judged.first_op;
  if (p.sides[0].Beyond()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the first op beyond its budget, op %d %s in %s, is wrong in the reference, not here: reduce %s "
        "--against %s",
        pair, p.a, op.name, op.module, reference.path, bundle.path));
  }
  if (!p.sides[1].known) {  // its call differs, and its error cannot be measured here (no fp64 kernel)
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: op %d %s in %s is called with other arguments (%s), and has no fp64 run here to judge it by", pair,
        p.b, op.name, op.module, p.arguments));
  }
  return *judged.first_op;
}

// `recorded` as `reference` calls it: its tensors and devices, the
// reference's other arguments (the scalars and options the diff found
// different; dtypes are widened to fp64 by the judgement anyway).
absl::StatusOr<formats::OpEvent> CalledAsReference(const formats::OpEvent& recorded,
                                                   const formats::OpEvent& reference) {
  using Kind = formats::OpArg::Kind;
  if (recorded.args.size() != reference.args.size()) {
    return absl::UnimplementedError(absl::StrFormat("%s is called with %d arguments here and %d in the reference",
                                                    recorded.name, recorded.args.size(), reference.args.size()));
  }
  formats::OpEvent out = recorded;
  for (size_t i = 0; i < out.args.size(); ++i) {
    const Kind k = recorded.args[i].kind;
    const bool own = k == Kind::kTensor || k == Kind::kTensors || k == Kind::kOptionalTensors || k == Kind::kDevice;
    if (!own) out.args[i] = reference.args[i];
  }
  return out;
}

// The error of output `slot` of `cut`'s one op, as recorded, against the
// op's fp64 run on its recorded inputs: an isolated replay of `cut` written
// with `values` to `path` (ReplayOptions::introduced, the diff's measure).
absl::StatusOr<double> Introduced(const formats::StepTrace& bundle, const formats::Trace& cut,
                                  const std::map<uint64_t, at::Tensor>& values, size_t slot, const std::string& path) {
  MOERR_RETURN_IF_ERROR(WriteCutBundle(path, bundle.step, cut, /*with_ops=*/true, values, *bundle.reader,
                                       formats::Recording{"full"}, /*compress=*/false));
  MOERR_ASSIGN_OR_RETURN(const std::unique_ptr<formats::BundleReader> reader, formats::BundleReader::Open(path));
  ReplayOptions measure;
  measure.isolated = true;
  measure.introduced = true;
  MOERR_ASSIGN_OR_RETURN(const ReplayReport report, ReplayTrace(*reader, bundle.step, cut, measure));
  for (const diff::ExactRunError& e : report.introduced) {
    if (e.slot == slot) return e.recorded;
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("%s has no fp64 run of output %d here to judge it by", cut.ops[0].name, slot));
}

// Fills `report` with the judged op `p`: BUNDLE is its side B.
void Describe(const diff::PrecisionOp& p, const formats::StepTrace& bundle, DivergenceReduceReport& report) {
  const formats::OpEvent& op = bundle.trace.ops[static_cast<size_t>(p.b)];
  report.op_index = static_cast<size_t>(p.b);
  report.against_op_index = static_cast<size_t>(p.a);
  report.op = op.name;
  report.module = op.module;
  report.phase = std::string(formats::PhaseName(op.phase));
  report.judged = p.sides[1];
  report.inherited = p.inherited;
  // Its own output beyond its budget is the failure, whatever its call;
  // within it, the failure is the call (Culprit).
  report.call_difference = p.sides[1].Beyond() ? "" : p.arguments;
}

// Writes the reduced bundle (the op and its values, mode full) and the repro.
// `called`: the op as the script's fp64 run calls it.
absl::Status WriteReduced(const formats::StepTrace& bundle, const formats::StepTrace& reference,
                          const DivergenceReduceOptions& options, const formats::Trace& cut,
                          const formats::OpEvent& called, const std::map<uint64_t, at::Tensor>& values,
                          DivergenceReduceReport& report) {
  const std::optional<formats::Recording> recording = formats::RecordingOf(*bundle.reader);
  formats::Recording annotation = recording.value_or(formats::Recording{});
  annotation.mode = "full";  // the op's output is recorded: the failure is its value
  annotation.reduced = llvm::json::Object{{"from", bundle.path},
                                          {"step", bundle.step},
                                          {"against", reference.path},
                                          {"against_step", reference.step},
                                          {"ops", static_cast<int64_t>(report.ops_before)},
                                          {"kept", int64_t{1}}};
  MOERR_RETURN_IF_ERROR(WriteCutBundle(options.out_path, bundle.step, cut, /*with_ops=*/true, values, *bundle.reader,
                                       annotation, /*compress=*/true));
  report.bytes_after = std::filesystem::file_size(options.out_path);
  const diff::IntroducedSide& judged = report.judged;
  DivergenceSource source{bundle.path, reference.path, bundle.step, reference.step, report.op_index, judged.slot,
                          judged.introduced, judged.budget, diff::kBudgetMultiple,
                          std::string(formats::DTypeName(judged.dtype)),
                          annotation.threads_or_zero(),
                          report.call_difference};
  return CatchTorch("writing the repro", [&] {
    MOERR_ASSIGN_OR_RETURN(report.assertion, WriteDivergenceScript(options.script_path, options.values_path, cut,
                                                                   called, values, source));
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<DivergenceReduceReport> ReduceDivergence(const formats::StepTrace& bundle,
                                                        const formats::StepTrace& reference,
                                                        const DivergenceReduceOptions& options,
                                                        const std::function<void(const std::string& what)>& progress) {
  MOERR_CHECK(!options.out_path.empty() && !options.script_path.empty() && !options.values_path.empty() &&
              !options.work_dir.empty());
  const Clock::time_point start = Clock::now();
  constexpr char kWhy[] = "a divergence is reduced to an op judged on its recorded inputs and output";
  MOERR_RETURN_IF_ERROR(NeedsRecordedOutputs(bundle, kWhy));
  MOERR_RETURN_IF_ERROR(NeedsRecordedOutputs(reference, kWhy));
  DivergenceReduceReport report;
  report.step = bundle.step;
  report.against_step = reference.step;
  report.ops_before = bundle.trace.ops.size();
  report.bytes_before = bundle.reader->file_size();

  // The diff as `moerr diff REF BUNDLE` judges it: A the reference.
  PrecisionDiffOptions diff_options;
  diff_options.progress = progress;
  MOERR_ASSIGN_OR_RETURN(const diff::PrecisionDiff judged,
                         DiffPrecisions(*reference.reader, reference.trace, reference.step, *bundle.reader,
                                        bundle.trace, bundle.step, diff_options));
  report.diff_seconds = SecondsSince(start);
  MOERR_ASSIGN_OR_RETURN(const size_t culprit, Culprit(judged, bundle, reference));
  Describe(judged.ops[culprit], bundle, report);

  if (progress) progress("cutting the op free");
  MOERR_ASSIGN_OR_RETURN(OneOpCut alone, CutOneOp(bundle, report.op_index));
  const formats::Trace& cut = alone.cut;
  const std::map<uint64_t, at::Tensor>& values = alone.values;
  if (!values.count(bundle.trace.ops[report.op_index].outputs[report.judged.slot])) {
    return absl::DataLossError(absl::StrFormat("%s: output %d of op %d is not in the bundle", Where(bundle),
                                               report.judged.slot, report.op_index));
  }
  formats::OpEvent called = cut.ops[0];
  if (!report.call_difference.empty()) {
    // Its own output is within its budget: it is judged against the op
    // called as the reference calls it, on the same recorded inputs.
    MOERR_ASSIGN_OR_RETURN(called, CalledAsReference(cut.ops[0], reference.trace.ops[report.against_op_index]));
    formats::Trace as_reference = cut;
    as_reference.ops[0] = called;
    const std::string path = (std::filesystem::path(options.work_dir) / "called.moerr").string();
    MOERR_ASSIGN_OR_RETURN(report.judged.introduced,
                           Introduced(bundle, as_reference, values, report.judged.slot, path));
  }
  MOERR_RETURN_IF_ERROR(WriteReduced(bundle, reference, options, cut, called, values, report));
  report.seconds = SecondsSince(start);
  return report;
}

}  // namespace moerr::replayer
