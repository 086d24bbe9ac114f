#include "replayer/vendor_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/dtype.h"
#include "formats/json_number.h"

namespace moerr::replayer {

bool HasReferencedOps(const formats::Trace& trace, const replayer::OpReferences& references) {
  return std::any_of(trace.ops.begin(), trace.ops.end(),
                     [&](const formats::OpEvent& op) { return references.Find(op.name) != nullptr; });
}

VendorCheck CheckVendorOps(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                           const replayer::OpReferences& references) {
  VendorCheck out;
  if (!HasReferencedOps(trace, references)) return out;
  replayer::ReplayOptions options;
  options.isolated = true;
  options.references = &references;
  const absl::StatusOr<replayer::ReplayReport> report = replayer::ReplayTrace(reader, step, trace, options);
  if (!report.ok()) {
    out.skipped = std::string(report.status().message());
    return out;
  }
  // reference_checks is in execution order: an op's outputs are adjacent.
  size_t last_op = SIZE_MAX;
  for (const replayer::ReferenceCheck& c : report->reference_checks) {
    if (c.op_index != last_op) ++out.checked_ops;
    last_op = c.op_index;
    if (!c.suspect) continue;
    if (!out.suspect.empty() && out.suspect.back().op_index == c.op_index) {
      if (c.recorded_ulps > out.suspect.back().recorded_ulps) out.suspect.back() = c;
    } else {
      out.suspect.push_back(c);
    }
  }
  return out;
}

std::string DescribeVendorOp(const replayer::ReferenceCheck& c, const formats::Trace& trace) {
  const formats::OpEvent& op = trace.ops[c.op_index];
  return absl::StrFormat("op %d %s (%s, %s) is %d ULPs of %s from its reference, which is %d from fp64 (allowed %d)",
                         c.op_index, op.name, formats::PhaseName(op.phase), op.module.empty() ? "no module" : op.module,
                         c.recorded_ulps, formats::DTypeName(c.dtype), c.reference_ulps, c.allowed_ulps);
}

llvm::json::Object VendorNumbers(const replayer::ReferenceCheck& c) {
  return llvm::json::Object{{"output_slot", static_cast<int64_t>(c.slot)},
                            {"dtype", std::string(formats::DTypeName(c.dtype))},
                            {"recorded_ulps", static_cast<int64_t>(c.recorded_ulps)},
                            {"reference_ulps", static_cast<int64_t>(c.reference_ulps)},
                            {"allowed_ulps", static_cast<int64_t>(c.allowed_ulps)},
                            {"recorded_rel_l2", formats::JsonNumber(c.recorded_rel_l2)},
                            {"reference_rel_l2", formats::JsonNumber(c.reference_rel_l2)}};
}

llvm::json::Object VendorOpJson(const replayer::ReferenceCheck& c, const formats::Trace& trace) {
  const formats::OpEvent& op = trace.ops[c.op_index];
  llvm::json::Object o = VendorNumbers(c);
  o["op_index"] = static_cast<int64_t>(c.op_index);
  o["op"] = op.name;
  o["module"] = op.module;
  o["phase"] = std::string(formats::PhaseName(op.phase));
  o["verdict"] = "suspect";
  return o;
}

namespace {

// lint's vendor-op finding (an error) for a suspect op of `bundle`.
analysis::Finding VendorOpFinding(const replayer::ReferenceCheck& c, const formats::Trace& trace, int64_t step,
                                  const std::string& bundle, const std::vector<std::string>& reference_specs) {
  const formats::OpEvent& op = trace.ops[c.op_index];
  analysis::Finding f;
  f.severity = analysis::Severity::kError;
  f.step = step;
  f.op_index = static_cast<int64_t>(c.op_index);
  f.op = op.name;
  f.where = op.module.empty() ? "step" : op.module;
  f.phase = std::string(formats::PhaseName(op.phase));
  f.message = absl::StrFormat(
      "output %d is %d ULPs of %s from the reference's fp64 run, which is itself %d from it (allowed %d): the vendor "
      "op is further from fp64 than its dtype explains",
      c.slot, c.recorded_ulps, formats::DTypeName(c.dtype), c.reference_ulps, c.allowed_ulps);
  f.numbers = VendorNumbers(c);
  f.next = absl::StrFormat("moerr replay %s --step %d --isolated", bundle, step);
  for (const std::string& spec : reference_specs) absl::StrAppend(&f.next, " --reference ", spec);
  return f;
}

// The text of one bundle's VendorCheck of `step`, each line after "step N: "
// starting with `prefix` ("rank K: " in a run directory). Silent when no op
// has a reference.
void PrintVendorCheck(const VendorCheck& check, int64_t step, const formats::Trace& trace, const std::string& prefix) {
  const long long n = step;
  if (!check.skipped.empty()) {
    std::printf("step %lld: %svendor ops not checked against their references: %s\n", n, prefix.c_str(),
                check.skipped.c_str());
  } else if (check.checked_ops > 0 && check.suspect.empty()) {
    std::printf("step %lld: %s%zu vendor ops checked against their references: consistent\n", n, prefix.c_str(),
                check.checked_ops);
  }
  for (const ReferenceCheck& c : check.suspect) {
    std::printf("step %lld: %svendor op suspect: %s\n", n, prefix.c_str(), DescribeVendorOp(c, trace).c_str());
  }
}

}  // namespace

int ReportVendorOps(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                    const OpReferences& references, llvm::json::Object* result) {
  const VendorCheck check = CheckVendorOps(reader, step, trace, references);
  if (result != nullptr) {
    llvm::json::Array ops;
    for (const ReferenceCheck& c : check.suspect) ops.push_back(VendorOpJson(c, trace));
    if (check.checked_ops > 0) (*result)["vendor_ops"] = std::move(ops);
    if (!check.skipped.empty()) (*result)["vendor_ops_skipped"] = check.skipped;
  } else {
    PrintVendorCheck(check, step, trace, "");
  }
  return check.suspect.empty() ? kExitOk : kExitFinding;
}

int ReportRankVendorOps(const formats::WorldStep& world, const OpReferences& references,
                        llvm::json::Object* result) {
  int exit_code = kExitOk;
  size_t checked = 0;
  llvm::json::Array ops, skipped;
  for (const formats::RankStep& r : world.ranks) {
    if (r.reader == nullptr || !r.trace) continue;
    const VendorCheck check = CheckVendorOps(*r.reader, world.step, *r.trace, references);
    checked += check.checked_ops;
    if (!check.suspect.empty()) exit_code = kExitFinding;
    if (result == nullptr) {
      PrintVendorCheck(check, world.step, *r.trace, absl::StrFormat("rank %d: ", r.rank));
      continue;
    }
    for (const ReferenceCheck& c : check.suspect) {
      llvm::json::Object o = VendorOpJson(c, *r.trace);
      o["rank"] = r.rank;
      ops.push_back(std::move(o));
    }
    if (!check.skipped.empty()) skipped.push_back(llvm::json::Object{{"rank", r.rank}, {"reason", check.skipped}});
  }
  if (result != nullptr && checked > 0) (*result)["vendor_ops"] = std::move(ops);
  if (result != nullptr && !skipped.empty()) (*result)["vendor_ops_skipped"] = std::move(skipped);
  return exit_code;
}

absl::Status ReferenceJudge::Judge(const analysis::StepView& step, std::vector<analysis::Finding>& out) const {
  const VendorCheck check = CheckVendorOps(*step.reader, step.step, *step.trace, references_);
  if (!check.skipped.empty()) {
    std::fprintf(stderr, "moerr: note: %s step %lld: vendor-op not checked: %s\n", step.path.c_str(),
                 static_cast<long long>(step.step), check.skipped.c_str());
  }
  for (const ReferenceCheck& c : check.suspect) {
    out.push_back(VendorOpFinding(c, *step.trace, step.step, step.path, specs_));
  }
  return absl::OkStatus();
}

}  // namespace moerr::replayer
