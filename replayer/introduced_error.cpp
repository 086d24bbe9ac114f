#include "replayer/introduced_error.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "diff/tensor_metrics.h"
#include "formats/collective_op.h"
#include "formats/dtype.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/boxed_call.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

using formats::OpArg;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The relative L2 error of `values` against `exact` (the fp64 run); +inf
// where `values` hold a NaN or Inf that `exact` does not.
absl::StatusOr<double> ErrorAgainst(const formats::TensorView& exact, const formats::TensorView& values) {
  MOERR_ASSIGN_OR_RETURN(const diff::TensorMetrics m, diff::CompareTensors(exact, values));
  return m.nan_mismatch + m.inf_mismatch > 0 ? kInf : m.rel_l2;
}

// An argument whose value a precision or device changes, by its schema type.
bool PrecisionArgument(const c10::Argument& arg) {
  c10::TypePtr type = arg.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::DeviceObjType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType: return true;
    default: return false;
  }
}

bool IsTensorKind(OpArg::Kind k) {
  return k == OpArg::Kind::kTensor || k == OpArg::Kind::kTensors || k == OpArg::Kind::kOptionalTensors;
}

std::string Describe(const OpArg& x) {
  switch (x.kind) {
    case OpArg::Kind::kNone: return "None";
    case OpArg::Kind::kInt:
    case OpArg::Kind::kWrappedInt: return absl::StrCat(x.i);
    case OpArg::Kind::kFloat:
    case OpArg::Kind::kWrappedFloat: return absl::StrFormat("%.9g", x.f);
    case OpArg::Kind::kBool:
    case OpArg::Kind::kWrappedBool: return x.i ? "True" : "False";
    case OpArg::Kind::kInts:
    case OpArg::Kind::kBools: return absl::StrCat("[", absl::StrJoin(x.ints, ", "), "]");
    case OpArg::Kind::kFloats:
      return absl::StrCat("[", absl::StrJoin(x.floats, ", ", [](std::string* out, double f) {
                            absl::StrAppendFormat(out, "%.9g", f);
                          }), "]");
    case OpArg::Kind::kText: return absl::StrCat("\"", x.text, "\"");
    default: return std::string(formats::ArgKindName(x.kind));
  }
}

bool Same(const OpArg& x, const OpArg& y) {
  const bool same_float = x.f == y.f || (std::isnan(x.f) && std::isnan(y.f));
  return x.kind == y.kind && x.i == y.i && same_float && x.text == y.text && x.ints == y.ints &&
         x.floats == y.floats;
}

// One side measured: its isolated replay's introduced errors, or none and
// why it cannot be measured (in `because`).
std::vector<diff::ExactRunError> MeasureSide(const formats::BundleReader& reader, int64_t step,
                                                             const formats::Trace& trace, std::string& because) {
  ReplayOptions options;
  options.isolated = true;
  options.introduced = true;
  absl::StatusOr<ReplayReport> report = ReplayTrace(reader, step, trace, options);
  if (!report.ok()) {  // the diff goes on, estimated
    because = std::string(report.status().message());
    return std::vector<diff::ExactRunError>();
  }
  return std::move(report->introduced);
}

}  // namespace

bool Measurable(const formats::Trace& trace, const formats::OpEvent& op) {
  for (uint64_t id : op.outputs) {
    const formats::TensorMeta* meta = id != 0 ? trace.Find(id) : nullptr;
    if (meta != nullptr && meta->producer == static_cast<int64_t>(op.seq) && !meta->leaf.empty() &&
        formats::IsFloating(meta->dtype)) {
      return true;
    }
  }
  return false;
}

absl::Status MeasureIntroduced(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                               size_t index, const c10::OperatorHandle& handle, std::vector<c10::IValue> exact,
                               const std::vector<at::Tensor>& replayed, ReplayReport& report) {
  const formats::OpEvent& op = trace.ops[index];
  at::autocast::set_autocast_enabled(at::kCPU, false);
  const absl::StatusOr<std::vector<at::Tensor>> wide = CallBoxed(handle, std::move(exact));
  if (!wide.ok()) {  // no fp64 kernel (or fp64 arguments it refuses): no verdict
    ++report.no_exact_run;
    return absl::OkStatus();
  }
  for (size_t o = 0; o < op.outputs.size() && o < wide->size() && o < replayed.size(); ++o) {
    const formats::TensorMeta* meta = op.outputs[o] != 0 ? trace.Find(op.outputs[o]) : nullptr;
    if (meta == nullptr || meta->producer != static_cast<int64_t>(op.seq) || meta->leaf.empty() ||
        !formats::IsFloating(meta->dtype)) {
      continue;
    }
    const at::Tensor& e = (*wide)[o];
    const at::Tensor& r = replayed[o];
    if (!e.defined() || !r.defined() || !e.is_floating_point() || e.sizes() != r.sizes()) continue;
    MOERR_ASSIGN_OR_RETURN(const formats::OwnedTensor recorded, reader.ReadTensor(meta->leaf, step));
    MOERR_ASSIGN_OR_RETURN(const formats::TensorView exact_view, recorder::ViewOf(e.to(at::kDouble).cpu()));
    MOERR_ASSIGN_OR_RETURN(const formats::TensorView replayed_view, recorder::ViewOf(r.cpu()));
    if (recorded.view().shape != exact_view.shape) continue;
    MOERR_ASSIGN_OR_RETURN(const double recorded_error, ErrorAgainst(exact_view, recorded.view()));
    MOERR_ASSIGN_OR_RETURN(const double replayed_error, ErrorAgainst(exact_view, replayed_view));
    report.introduced.push_back(diff::ExactRunError{index, o, meta->dtype, recorded_error, replayed_error});
  }
  return absl::OkStatus();
}

std::string CallDifference(const formats::OpEvent& a, const formats::OpEvent& b) {
  // A collective's arguments hash the values it moved: they differ with
  // any difference of the values, which the ops after it judge.
  if (a.name != b.name || a.overload != b.overload || formats::IsCollective(a)) return "";
  const c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(a.name, a.overload));
  const std::vector<c10::Argument>* schema = handle ? &handle->schema().arguments() : nullptr;
  for (size_t i = 0; i < a.args.size() && i < b.args.size(); ++i) {
    const OpArg& x = a.args[i];
    const OpArg& y = b.args[i];
    if ((IsTensorKind(x.kind) && IsTensorKind(y.kind)) || x.kind == OpArg::Kind::kDevice) continue;
    const c10::Argument* arg = schema != nullptr && i < schema->size() ? &(*schema)[i] : nullptr;
    if (arg != nullptr && PrecisionArgument(*arg)) continue;
    if (Same(x, y)) continue;
    return absl::StrFormat("argument %d%s: %s vs %s", i, arg != nullptr ? " (" + arg->name() + ")" : "",
                           IsTensorKind(x.kind) ? "a tensor" : Describe(x),
                           IsTensorKind(y.kind) ? "a tensor" : Describe(y));
  }
  return "";
}

namespace {

// `observed` judged, each side measured where it can be.
absl::StatusOr<diff::PrecisionDiff> Judge(const formats::BundleReader& reader_a, const formats::Trace& a,
                                          int64_t step_a, const formats::BundleReader& reader_b,
                                          const formats::Trace& b, int64_t step_b, diff::DiffReport observed,
                                          const PrecisionDiffOptions& options) {
  auto progress = [&](const std::string& what) {
    if (options.progress) options.progress(what);
  };
  std::vector<diff::ExactRunError> exact_a, exact_b;
  std::string because;
  if (options.measure && options.diff.compare_bytes) {
    progress("replaying A beside fp64");
    exact_a = MeasureSide(reader_a, step_a, a, because);
    if (because.empty()) {
      progress("replaying B beside fp64");
      exact_b = MeasureSide(reader_b, step_b, b, because);
      if (!because.empty()) because = "B: " + because;
    } else {
      because = "A: " + because;
    }
  }
  progress("judging");
  MOERR_ASSIGN_OR_RETURN(diff::PrecisionDiff report,
                         diff::JudgePrecision(reader_a, a, step_a, reader_b, b, step_b, std::move(observed), exact_a,
                                              exact_b, CallDifference, options.diff));
  report.estimated_because = because;
  return report;
}

}  // namespace

absl::StatusOr<diff::PrecisionDiff> DiffPrecisions(const formats::BundleReader& reader_a, const formats::Trace& a,
                                                   int64_t step_a, const formats::BundleReader& reader_b,
                                                   const formats::Trace& b, int64_t step_b,
                                                   const PrecisionDiffOptions& options) {
  if (options.progress) options.progress("diffing");
  MOERR_ASSIGN_OR_RETURN(diff::DiffReport observed,
                         diff::DiffTraces(reader_a, a, step_a, reader_b, b, step_b, options.diff));
  return Judge(reader_a, a, step_a, reader_b, b, step_b, std::move(observed), options);
}

absl::StatusOr<std::vector<PrecisionPart>> DiffWorldPrecisions(const formats::WorldStep& a,
                                                               const formats::WorldStep& b,
                                                               const PrecisionDiffOptions& options) {
  if (options.progress) options.progress("diffing");
  MOERR_ASSIGN_OR_RETURN(std::vector<diff::WorldDiffPart> parts, diff::DiffWorlds(a, b, options.diff));
  std::vector<PrecisionPart> out;
  for (diff::WorldDiffPart& p : parts) {
    PrecisionDiffOptions part_options = options;
    if (options.progress) {
      part_options.progress = [&](const std::string& what) { options.progress(p.what + ": " + what); };
    }
    // DiffWorlds read both ranks, so their readers are open.
    const formats::BundleReader& reader_a = *a.ranks[static_cast<size_t>(p.rank_a)].reader;
    const formats::BundleReader& reader_b = *b.ranks[static_cast<size_t>(p.rank_b)].reader;
    MOERR_ASSIGN_OR_RETURN(diff::PrecisionDiff judged, Judge(reader_a, p.a, a.step, reader_b, p.b, b.step,
                                                             std::move(p.report), part_options));
    out.push_back(PrecisionPart{p.what, p.rank_a, p.rank_b, std::move(p.a), std::move(p.b), std::move(judged)});
  }
  return out;
}

}  // namespace moerr::replayer
