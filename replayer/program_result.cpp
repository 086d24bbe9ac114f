#include "replayer/program_result.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/json_number.h"
#include "formats/module_path.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

std::string Describe(const formats::Fingerprint& f) {
  return absl::StrFormat("min %.6g max %.6g abs-max %.6g l2 %.6g nan %d +inf %d -inf %d hash %016x", f.min, f.max,
                         f.abs_max, f.l2, f.nan, f.pos_inf, f.neg_inf, f.hash);
}

llvm::json::Object FingerprintJson(const formats::Fingerprint& f) {
  return llvm::json::Object{{"min", formats::JsonNumber(f.min)},
                            {"max", formats::JsonNumber(f.max)},
                            {"mean", formats::JsonNumber(f.mean)},
                            {"abs_max", formats::JsonNumber(f.abs_max)},
                            {"l2", formats::JsonNumber(f.l2)},
                            {"nan", static_cast<int64_t>(f.nan)},
                            {"pos_inf", static_cast<int64_t>(f.pos_inf)},
                            {"neg_inf", static_cast<int64_t>(f.neg_inf)},
                            {"hash", absl::StrFormat("%016x", f.hash)}};
}

// ", 2 by reference, 3 not re-executed (npu::npu_swiglu x2, ...)": the ops
// of a step that did not run through this LibTorch; "" when none.
std::string ForeignOps(const replayer::ReplayReport& report) {
  std::string text;
  if (report.by_reference > 0) text += absl::StrFormat(", %d by reference", report.by_reference);
  if (report.not_reexecuted > 0) {
    std::vector<std::string> names;
    for (const auto& [name, count] : report.not_reexecuted_ops) names.push_back(absl::StrFormat("%s x%d", name, count));
    text += absl::StrFormat(", %d not re-executed (outputs from the record: %s)", report.not_reexecuted,
                            absl::StrJoin(names, ", "));
  }
  return text;
}

// The calls whose reference refused them, by op and reason: "npu::npu_fusion_attention x1: the reference
// refused: sparse_mode 5 is not implemented (0 to 4 are)".
void PrintRefusedCalls(const ProgramResult& r) {
  if (r.report->refused.empty()) return;
  std::map<std::pair<std::string, std::string>, size_t> calls;  // (op, reason) -> count
  for (const replayer::RefusedCall& c : r.report->refused) ++calls[{c.op, c.reason}];
  std::printf("  %zu call%s refused by %s reference (%s):\n", r.report->refused.size(),
              r.report->refused.size() > 1 ? "s" : "", r.report->refused.size() > 1 ? "their" : "its",
              r.isolated ? "no verdict; outputs from the record" : "not re-executed; outputs from the record");
  for (const auto& [call, count] : calls) {
    std::printf("    %s x%zu: the reference refused: %s\n", call.first.c_str(), count, call.second.c_str());
  }
}

// Isolated replay: each output of an op with a reference, and the verdict.
void PrintReferenceChecks(const ProgramResult& r) {
  if (r.report->reference_checks.empty()) return;
  std::printf("  ops checked against their references (max error in ULPs of the output's dtype, from the "
              "reference's fp64 run):\n");
  for (const replayer::ReferenceCheck& c : r.report->reference_checks) {
    const formats::OpEvent& op = r.trace->ops[c.op_index];
    std::printf("    op %6zu %-28s %-9s output %zu %-4s recorded %llu ULPs, reference %llu (allowed %llu): %s\n",
                c.op_index, op.name.c_str(), std::string(formats::PhaseName(op.phase)).c_str(), c.slot,
                std::string(formats::DTypeName(c.dtype)).c_str(), static_cast<unsigned long long>(c.recorded_ulps),
                static_cast<unsigned long long>(c.reference_ulps), static_cast<unsigned long long>(c.allowed_ulps),
                c.suspect ? "SUSPECT: further from fp64 than its dtype explains" : "consistent");
  }
}

}  // namespace

llvm::json::Object OpJson(size_t index, const formats::OpEvent& op) {
  return llvm::json::Object{{"op_index", static_cast<int64_t>(index)},
                            {"op", op.name},
                            {"module", op.module},
                            {"phase", std::string(formats::PhaseName(op.phase))}};
}

std::string Where(const formats::OpEvent& op) {
  return absl::StrFormat("%s (%s, %s)", op.name, op.module.empty() ? "no module" : op.module,
                         formats::PhaseName(op.phase));
}

void PrintProgramReplay(const ProgramResult& r) {
  const replayer::ReplayReport& report = *r.report;
  std::printf("step %lld: %zu ops: %zu re-dispatched%s, %zu random ops from the record%s; %zu outputs compared, "
              "%zu differ%s\n",
              static_cast<long long>(report.step), report.ops, report.dispatched,
              r.replayed ? absl::StrFormat(" (%d under the policy)", report.policy_ops).c_str() : "",
              report.from_record, ForeignOps(report).c_str(), report.compared, report.mismatched,
              report.within_tolerance > 0
                  ? absl::StrFormat(" (%d more within tolerance)", report.within_tolerance).c_str()
                  : "");
  if (report.other_device > 0) {
    std::printf("  %zu ops ran on %s when recorded and on the CPU now: their outputs are compared within the "
                "per-dtype tolerance (relative L2 from fingerprints), not bitwise\n",
                report.other_device, absl::StrJoin(report.recorded_devices, ", ").c_str());
  }
  if (const auto& d = report.first_divergence) {
    std::printf("  first divergence: op %zu %s, output %llu\n    recorded %s\n    replayed %s\n", d->op_index,
                Where(d->op).c_str(), static_cast<unsigned long long>(d->output), Describe(d->recorded).c_str(),
                Describe(d->replayed).c_str());
  }
  if (r.replayed) {
    auto where = [](const std::optional<analysis::FirstOverflow>& f) {
      return f ? absl::StrFormat("op %d %s", f->op_index, Where(*f->op)) : std::string("none");
    };
    std::printf("  first overflow: recorded %s; under the policy %s\n", where(r.recorded_overflow).c_str(),
                where(r.policy_overflow).c_str());
  }
  if (!r.worst.empty()) {
    std::printf("  ops whose own error is largest (relative L2 against the recorded output):\n");
    for (const replayer::OutputError& e : r.worst) {
      const formats::OpEvent& op = r.trace->ops[e.op_index];
      std::printf("    op %6zu %-24s %-40s rel-L2 %.3g  max-abs %.3g  max-ULP %llu\n", e.op_index, op.name.c_str(),
                  op.module.empty() ? "(no module)" : op.module.c_str(), e.metrics.rel_l2, e.metrics.max_abs,
                  static_cast<unsigned long long>(e.metrics.max_ulp));
    }
  }
  PrintRefusedCalls(r);
  PrintReferenceChecks(r);
  if (r.same) std::printf("  --check: a second replay is %s\n", *r.same ? "bitwise identical" : "DIFFERENT");
}

llvm::json::Object ProgramReplayJson(const ProgramResult& r) {
  const replayer::ReplayReport& report = *r.report;
  llvm::json::Object out{{"step", report.step},
                         {"mode", r.isolated ? "isolated" : "program"},
                         {"ops", static_cast<int64_t>(report.ops)},
                         {"dispatched", static_cast<int64_t>(report.dispatched)},
                         {"from_record", static_cast<int64_t>(report.from_record)},
                         {"compared", static_cast<int64_t>(report.compared)},
                         {"differ", static_cast<int64_t>(report.mismatched)},
                         {"within_tolerance", static_cast<int64_t>(report.within_tolerance)},
                         {"by_reference", static_cast<int64_t>(report.by_reference)},
                         {"not_reexecuted", static_cast<int64_t>(report.not_reexecuted)},
                         {"other_device_ops", static_cast<int64_t>(report.other_device)}};
  llvm::json::Array devices;
  for (const std::string& device : report.recorded_devices) devices.push_back(device);
  out["recorded_devices"] = std::move(devices);
  llvm::json::Object not_reexecuted;
  for (const auto& [name, count] : report.not_reexecuted_ops) not_reexecuted[name] = static_cast<int64_t>(count);
  out["not_reexecuted_ops"] = std::move(not_reexecuted);
  llvm::json::Array refused;  // calls whose reference refused them, in execution order
  for (const replayer::RefusedCall& c : report.refused) {
    llvm::json::Object o = OpJson(c.op_index, r.trace->ops[c.op_index]);
    o["reason"] = c.reason;
    refused.push_back(std::move(o));
  }
  out["refused"] = std::move(refused);
  if (r.isolated) {
    llvm::json::Array checks;
    for (const replayer::ReferenceCheck& c : report.reference_checks) {
      llvm::json::Object o = OpJson(c.op_index, r.trace->ops[c.op_index]);
      o["output_slot"] = static_cast<int64_t>(c.slot);
      o["dtype"] = std::string(formats::DTypeName(c.dtype));
      o["recorded_ulps"] = static_cast<int64_t>(c.recorded_ulps);
      o["reference_ulps"] = static_cast<int64_t>(c.reference_ulps);
      o["allowed_ulps"] = static_cast<int64_t>(c.allowed_ulps);
      o["recorded_rel_l2"] = formats::JsonNumber(c.recorded_rel_l2);
      o["reference_rel_l2"] = formats::JsonNumber(c.reference_rel_l2);
      o["verdict"] = c.suspect ? "suspect" : "consistent";
      checks.push_back(std::move(o));
    }
    out["reference_checks"] = std::move(checks);
  }
  llvm::json::Value first(nullptr);
  if (const auto& d = report.first_divergence) {
    llvm::json::Object o = OpJson(d->op_index, d->op);
    o["output"] = static_cast<int64_t>(d->output);
    o["recorded"] = FingerprintJson(d->recorded);
    o["replayed"] = FingerprintJson(d->replayed);
    first = std::move(o);
  }
  out["first_divergence"] = std::move(first);
  if (r.replayed) {
    auto where = [](const std::optional<analysis::FirstOverflow>& f) {
      return f ? llvm::json::Value(OpJson(f->op_index, *f->op)) : llvm::json::Value(nullptr);
    };
    out["policy_ops"] = static_cast<int64_t>(report.policy_ops);
    out["first_overflow"] = llvm::json::Object{{"recorded", where(r.recorded_overflow)},
                                               {"under_policy", where(r.policy_overflow)}};
  }
  if (!r.worst.empty()) {
    llvm::json::Array worst;
    for (const replayer::OutputError& e : r.worst) {
      llvm::json::Object o = OpJson(e.op_index, r.trace->ops[e.op_index]);
      o["rel_l2"] = formats::JsonNumber(e.metrics.rel_l2);
      o["max_abs"] = formats::JsonNumber(e.metrics.max_abs);
      o["max_ulp"] = static_cast<int64_t>(e.metrics.max_ulp);
      worst.push_back(std::move(o));
    }
    out["largest_own_errors"] = std::move(worst);
  }
  if (r.same) out["bitwise_identical_twice"] = *r.same;
  return out;
}

formats::Trace ReplayedTrace(const formats::Trace& recorded, const ReplayReport& report, size_t end_op) {
  formats::Trace out;
  out.ops.assign(recorded.ops.begin(), recorded.ops.begin() + std::min(end_op, recorded.ops.size()));
  out.tensors = recorded.tensors;
  out.routing = recorded.routing;
  absl::flat_hash_map<uint64_t, const ReplayedOutput*> replayed;
  for (const ReplayedOutput& r : report.outputs) replayed[r.id] = &r;
  for (formats::TensorMeta& meta : out.tensors) {
    auto it = replayed.find(meta.id);
    if (it == replayed.end()) continue;
    meta.fingerprint = it->second->fingerprint;
    meta.dtype = it->second->dtype;
  }
  out.Index();
  return out;
}

}  // namespace moerr::replayer
