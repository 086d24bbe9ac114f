#include "replayer/vendor_reduce.h"

#include <chrono>
#include <filesystem>
#include <memory>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "recorder/hooks/torch_boundary.h"
#include "replayer/repro_script.h"
#include "replayer/step_cut.h"
#include "replayer/vendor_check.h"
#include "support/check.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

using Clock = std::chrono::steady_clock;

// The first suspect op of `bundle`'s vendor-op check, or why there is none.
absl::StatusOr<ReferenceCheck> FirstSuspect(const formats::StepTrace& bundle, const OpReferences& references,
                                            VendorReduceReport& report) {
  const std::string where = absl::StrFormat("%s, step %d", bundle.path, bundle.step);
  const VendorCheck check = CheckVendorOps(*bundle.reader, bundle.step, bundle.trace, references);
  if (!check.skipped.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: its vendor ops could not be checked: %s", where, check.skipped));
  }
  report.checked_ops = check.checked_ops;
  report.suspect_ops = check.suspect.size();
  if (check.suspect.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: no op overflows, and each of the %d ops with a reference is within what its reference allows: there "
        "is nothing to reduce",
        where, check.checked_ops));
  }
  return check.suspect.front();
}

// Writes the reduced bundle: the op cut free, with its recorded outputs.
absl::Status WriteBundle(const formats::StepTrace& bundle, const VendorReduceOptions& options, const OneOpCut& alone,
                         VendorReduceReport& report) {
  formats::Recording annotation = formats::RecordingOf(*bundle.reader).value_or(formats::Recording{});
  annotation.mode = "full";  // the op's outputs are recorded: the failure is their value
  annotation.reduced = llvm::json::Object{{"from", bundle.path},
                                          {"step", bundle.step},
                                          {"ops", static_cast<int64_t>(report.ops_before)},
                                          {"kept", int64_t{1}},
                                          {"reference", report.op}};
  MOERR_RETURN_IF_ERROR(WriteCutBundle(options.out_path, bundle.step, alone.cut, /*with_ops=*/true, alone.values,
                                       *bundle.reader, annotation, /*compress=*/true));
  report.bytes_after = std::filesystem::file_size(options.out_path);
  return absl::OkStatus();
}

// The verdict on output `slot` of the reduced bundle's one op, judged again
// on what was written: it must say what the step said.
absl::StatusOr<ReferenceCheck> JudgeWritten(const std::string& path, int64_t step, const formats::Trace& cut,
                                            size_t slot, const OpReferences& references) {
  MOERR_ASSIGN_OR_RETURN(const std::unique_ptr<formats::BundleReader> reader, formats::BundleReader::Open(path));
  const VendorCheck check = CheckVendorOps(*reader, step, cut, references);
  if (!check.skipped.empty()) {
    return absl::InternalError(absl::StrFormat("the op cut free could not be checked: %s", check.skipped));
  }
  for (const ReferenceCheck& c : check.suspect) {
    if (c.slot == slot) return c;
  }
  return absl::InternalError(absl::StrFormat(
      "op %s cut free on its recorded inputs is not suspect in output %d, as it was in the step", cut.ops[0].name,
      slot));
}

// Copies the reference beside the repro, and writes the repro.
absl::Status WriteRepro(const formats::StepTrace& bundle, const VendorReduceOptions& options, const OneOpCut& alone,
                        const OpReferences::Info& reference, VendorReduceReport& report) {
  std::error_code error;
  std::filesystem::copy_file(reference.file, options.reference_path,
                             std::filesystem::copy_options::overwrite_existing, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrFormat("cannot copy %s to %s: %s", reference.file, options.reference_path, error.message()));
  }
  const std::optional<formats::Recording> recording = formats::RecordingOf(*bundle.reader);
  const VendorSource source{bundle.path,
                            bundle.step,
                            report.op_index,
                            report.verdict.slot,
                            report.verdict.dtype,
                            std::filesystem::path(options.reference_path).filename().string(),
                            std::filesystem::absolute(reference.file).string(),
                            reference.ulps,
                            report.verdict.recorded_ulps,
                            report.verdict.allowed_ulps,
                            recording ? recording->threads_or_zero() : 0};
  return CatchTorch("writing the repro", [&] {
    MOERR_ASSIGN_OR_RETURN(report.assertion,
                           WriteVendorScript(options.script_path, options.values_path, alone.cut, alone.values, source));
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<VendorReduceReport> ReduceVendorOp(const formats::StepTrace& bundle, const OpReferences& references,
                                                  const VendorReduceOptions& options,
                                                  const std::function<void(const std::string& what)>& progress) {
  MOERR_CHECK(!options.out_path.empty() && !options.script_path.empty() && !options.values_path.empty() &&
              !options.reference_path.empty());
  const Clock::time_point start = Clock::now();
  if (!HasReferencedOps(bundle.trace, references)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s, step %d has no overflow, and none of its ops has a reference (--reference OP=FILE adds one): the "
        "op-level reduce keeps a first overflow, a vendor op's verdict against its reference, or, with --against "
        "REF, a divergence from a reference recording",
        bundle.path, bundle.step));
  }
  MOERR_RETURN_IF_ERROR(NeedsRecordedOutputs(
      bundle, "a vendor op's verdict is reduced to the op judged on its recorded inputs and outputs"));
  VendorReduceReport report;
  report.step = bundle.step;
  report.ops_before = bundle.trace.ops.size();
  report.bytes_before = bundle.reader->file_size();

  if (progress) progress("checking the vendor ops");
  MOERR_ASSIGN_OR_RETURN(const ReferenceCheck suspect, FirstSuspect(bundle, references, report));
  report.check_seconds = SecondsSince(start);
  const formats::OpEvent& op = bundle.trace.ops[suspect.op_index];
  report.op_index = suspect.op_index;
  report.op = op.name;
  report.module = op.module;
  report.phase = std::string(formats::PhaseName(op.phase));
  const OpReferences::Info* reference = references.Find(op.name);
  MOERR_CHECK(reference != nullptr);
  report.reference = reference->file;

  if (progress) progress("cutting the op free");
  MOERR_ASSIGN_OR_RETURN(const OneOpCut alone, CutOneOp(bundle, suspect.op_index, &references));
  MOERR_RETURN_IF_ERROR(WriteBundle(bundle, options, alone, report));
  if (progress) progress("judging the reduced bundle");
  absl::StatusOr<ReferenceCheck> verdict =
      JudgeWritten(options.out_path, bundle.step, alone.cut, suspect.slot, references);
  if (!verdict.ok()) {
    std::error_code ignored;
    std::filesystem::remove(options.out_path, ignored);  // it does not show the failure
    return Annotate(verdict.status(), absl::StrFormat("%s, step %d", bundle.path, bundle.step));
  }
  report.verdict = *verdict;
  report.verdict.op_index = suspect.op_index;  // in the recorded step, not the cut
  report.description = DescribeVendorOp(report.verdict, bundle.trace);
  MOERR_RETURN_IF_ERROR(WriteRepro(bundle, options, alone, *reference, report));
  report.seconds = SecondsSince(start);
  return report;
}

}  // namespace moerr::replayer
