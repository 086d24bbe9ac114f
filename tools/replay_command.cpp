#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "diff/trace_diff.h"
#include "formats/bundle_reader.h"
#include "formats/module_path.h"
#include "formats/world_manifest.h"
#include "analysis/first_overflow.h"
#include "replayer/model_replay.h"
#include "replayer/program_replay.h"
#include "replayer/step_failure.h"
#include "support/status.h"
#include "tools/command.h"
#include "tools/replay_ranks.h"
#include "tools/world_replay_report.h"
#include "tools/run_directory.h"

namespace moerr::tools {
namespace {

std::string Describe(const formats::Fingerprint& f) {
  return absl::StrFormat("min %.6g max %.6g abs-max %.6g l2 %.6g nan %d +inf %d -inf %d hash %016x", f.min, f.max,
                         f.abs_max, f.l2, f.nan, f.pos_inf, f.neg_inf, f.hash);
}

llvm::json::Object FingerprintJson(const formats::Fingerprint& f) {
  return llvm::json::Object{{"min", JsonNumber(f.min)},
                            {"max", JsonNumber(f.max)},
                            {"mean", JsonNumber(f.mean)},
                            {"abs_max", JsonNumber(f.abs_max)},
                            {"l2", JsonNumber(f.l2)},
                            {"nan", static_cast<int64_t>(f.nan)},
                            {"pos_inf", static_cast<int64_t>(f.pos_inf)},
                            {"neg_inf", static_cast<int64_t>(f.neg_inf)},
                            {"hash", absl::StrFormat("%016x", f.hash)}};
}

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

// For a proxy bundle's expert module: " (the original's expert N)", read
// from the bundle's "proxy" annotation; otherwise "".
std::string OriginalExpert(const formats::BundleReader& reader, const std::string& module) {
  const auto expert = formats::ExpertOf(module);
  auto info = reader.ReadAnnotation("proxy");
  if (!expert || !info.ok() || !info->getAsObject()) return "";
  const llvm::json::Array* layers = info->getAsObject()->getArray("layers");
  for (size_t i = 0; layers != nullptr && i < layers->size(); ++i) {
    const llvm::json::Object* layer = (*layers)[i].getAsObject();
    const llvm::json::Array* kept = layer ? layer->getArray("kept") : nullptr;
    if (kept == nullptr || layer->getInteger("layer") != expert->first || expert->second >= int64_t(kept->size())) {
      continue;
    }
    if (auto original = (*kept)[expert->second].getAsInteger()) {
      return absl::StrFormat(" (the original's expert %d)", *original);
    }
  }
  return "";
}

// The text form of ModelReplay's report, up to the op-by-op comparison.
void PrintModelReplay(int64_t step, const replayer::ModelReplayOptions& options, const replayer::ModelReplayReport& report,
                      const std::pair<const char*, double> (&metrics)[4]) {
  std::printf("step %lld: model replay in %.2f s; routing %s: %lld of %lld decisions from the record",
              static_cast<long long>(step), report.seconds, options.routing_replay ? "replayed" : "live",
              static_cast<long long>(report.forced), static_cast<long long>(report.decisions));
  if (report.slots > 0) {
    std::printf("; the live router picks the recorded expert in %.2f%% of %lld token slots",
                100.0 * report.live_agree / report.slots, static_cast<long long>(report.slots));
  }
  std::printf("\n");
  if (!report.routing_problem.empty()) std::printf("  routing: %s\n", report.routing_problem.c_str());
  for (const auto& [name, replayed] : metrics) {
    // MetricsToJson writes non-finite values as "nan", "inf", "-inf".
    std::string recorded = "-";
    if (const llvm::json::Value* v = report.recorded_metrics.get(name)) {
      if (auto n = v->getAsNumber()) recorded = absl::StrFormat("%.9g", *n);
      if (auto s = v->getAsString()) recorded = s->str();
    }
    std::printf("  %-10s recorded %-16s replayed %s\n", name, recorded.c_str(),
                std::isnan(replayed) ? "nan" : absl::StrFormat("%.9g", replayed).c_str());
  }
}

llvm::json::Object ModelReplayJson(int64_t step, const replayer::ModelReplayOptions& options,
                                   const replayer::ModelReplayReport& report,
                                   const std::pair<const char*, double> (&metrics)[4]) {
  llvm::json::Object values;
  for (const auto& [name, replayed] : metrics) {
    // MetricsToJson writes non-finite values as "nan", "inf", "-inf".
    const llvm::json::Value* recorded = report.recorded_metrics.get(name);
    values[name] = llvm::json::Object{{"recorded", recorded ? *recorded : llvm::json::Value(nullptr)},
                                      {"replayed", JsonNumber(replayed)}};
  }
  return llvm::json::Object{
      {"step", step},
      {"mode", "model"},
      {"seconds", report.seconds},
      {"routing", options.routing_replay ? "replayed" : "live"},
      {"decisions", report.decisions},
      {"forced", report.forced},
      {"live_router_agrees", report.slots > 0 ? llvm::json::Value(double(report.live_agree) / report.slots)
                                              : llvm::json::Value(nullptr)},
      {"routing_problem", report.routing_problem.empty() ? llvm::json::Value(nullptr)
                                                         : llvm::json::Value(report.routing_problem)},
      {"metrics", std::move(values)}};
}

// A bundle without ops (a proxy): where the replayed step `b` first
// overflows. A finding when it does.
int ReportReplayOverflow(const formats::BundleReader& reader, const formats::Trace& b, llvm::json::Object* json) {
  const auto first = analysis::FindFirstOverflow(b);
  if (json != nullptr) {
    llvm::json::Value where(nullptr);
    if (first) {
      llvm::json::Object o = OpJson(first->op_index, *first->op);
      o["original_expert"] = OriginalExpert(reader, first->op->module);
      where = std::move(o);
    }
    (*json)["first_overflow"] = std::move(where);
  } else {
    std::printf("  the bundle records no ops to compare with (a proxy bundle); first overflow of the replay: %s\n",
                first ? absl::StrFormat("op %d %s%s", first->op_index, Where(*first->op),
                                        OriginalExpert(reader, first->op->module))
                            .c_str()
                      : "none");
  }
  return first ? kExitFinding : kExitOk;
}

// The record `a` and the replay `b` of `step`, compared op by op. A finding
// when they diverge or do not align.
CommandResult CompareWithRecord(const formats::BundleReader& reader, const formats::Trace& a,
                                const formats::BundleReader& replay, const formats::Trace& b, int64_t step,
                                llvm::json::Object* json) {
  diff::DiffOptions diff_options;
  diff_options.compare_bytes = false;  // the replay is recorded with fingerprints only
  MOERR_ASSIGN_OR_RETURN(const diff::DiffReport d, diff::DiffTraces(reader, a, step, replay, b, step, diff_options));
  if (json != nullptr) {
    (*json)["ops_aligned"] = static_cast<int64_t>(d.matched);
    (*json)["only_in_record"] = static_cast<int64_t>(d.only_a);
    (*json)["only_in_replay"] = static_cast<int64_t>(d.only_b);
    (*json)["diverged"] = static_cast<int64_t>(d.diverged_ops);
    llvm::json::Value first(nullptr);
    if (d.first_divergence) {
      const diff::OpDiff& op = d.ops[*d.first_divergence];
      llvm::json::Object o = OpJson(op.a, a.ops[op.a]);
      o["error"] = JsonNumber(op.error);
      first = std::move(o);
    }
    (*json)["first_divergence"] = std::move(first);
  } else {
    std::printf("  op by op: %zu ops aligned, %zu only in the record, %zu only in the replay, %zu diverged\n",
                d.matched, d.only_a, d.only_b, d.diverged_ops);
    if (d.first_divergence) {
      const diff::OpDiff& first = d.ops[*d.first_divergence];
      std::printf("  first divergence: op %lld %s, error %.3g\n", static_cast<long long>(first.a),
                  Where(a.ops[first.a]).c_str(), first.error);
    }
  }
  return d.diverged_ops > 0 || d.only_a + d.only_b > 0 ? kExitFinding : kExitOk;
}

// `moerr replay --model`: runs the step again on a rebuilt model, records it
// to `options.record_path` and compares it op by op with the record; prints
// what it found, or puts it in `json` when given.
CommandResult ModelReplay(const formats::BundleReader& reader, int64_t step, replayer::ModelReplayOptions options,
                          llvm::json::Object* json) {
  MOERR_ASSIGN_OR_RETURN(const replayer::ReplayedStep replayed, replayer::ReplayModelStepTrace(reader, step, options));
  const replayer::ModelReplayReport& report = replayed.report;
  const moe::StepMetrics& m = report.metrics;
  const std::pair<const char*, double> metrics[] = {
      {"loss", m.loss}, {"grad_norm", m.grad_norm}, {"reward", m.reward}, {"kl", m.kl}};
  if (json != nullptr) {
    *json = ModelReplayJson(step, options, report, metrics);
  } else {
    PrintModelReplay(step, options, report, metrics);
  }
  MOERR_ASSIGN_OR_RETURN(const formats::Trace a, formats::ReadTrace(reader, step));
  const formats::Trace& b = replayed.recording.trace;
  if (a.ops.empty()) return ReportReplayOverflow(reader, b, json);
  return CompareWithRecord(reader, a, *replayed.recording.reader, b, step, json);
}

// What a program replay of one step found.
struct ProgramResult {
  const replayer::ReplayReport* report = nullptr;
  const formats::Trace* trace = nullptr;
  bool isolated = false;
  // With a precision policy: the step as the replay saw it, and the first
  // overflow of the record and of the replay (pointing into those traces).
  std::optional<formats::Trace> replayed;
  std::optional<analysis::FirstOverflow> recorded_overflow, policy_overflow;
  std::vector<replayer::OutputError> worst;  // isolated: the largest own errors, worst first
  std::optional<bool> same;                  // --check: whether a second replay was bitwise identical
};

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
      o["recorded_rel_l2"] = JsonNumber(c.recorded_rel_l2);
      o["reference_rel_l2"] = JsonNumber(c.reference_rel_l2);
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
      o["rel_l2"] = JsonNumber(e.metrics.rel_l2);
      o["max_abs"] = JsonNumber(e.metrics.max_abs);
      o["max_ulp"] = static_cast<int64_t>(e.metrics.max_ulp);
      worst.push_back(std::move(o));
    }
    out["largest_own_errors"] = std::move(worst);
  }
  if (r.same) out["bitwise_identical_twice"] = *r.same;
  return out;
}

// Why step `step` of `path`, which records no ops, has nothing to
// re-dispatch: the step bundles `moerr proxy` (marked by its "proxy"
// annotation) and `moerr reduce` write hold a model's state and routing,
// which model replay runs.
absl::Status NoOpsToReplay(const formats::BundleReader& reader, const std::string& path, int64_t step) {
  if (reader.ReadAnnotation("proxy").ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is a proxy bundle: it records no ops to re-execute; replay it with --model: moerr replay %s --model",
        path, path));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "step %d of %s records no ops to re-execute; a bundle moerr proxy or moerr reduce wrote is replayed with "
      "--model: moerr replay %s --model",
      step, path, path));
}

struct ReplayArgs {
  std::string bundle;
  std::vector<int64_t> steps;
  bool check = false, isolated = false, model = false, live_routing = false, force = false, json = false;
  std::string policy, precision, out;
  std::vector<std::string> references;  // --reference OP=FILE
  int64_t rank = -1;                      // --rank K of a run directory
  int64_t ranks = 0;                      // --ranks M: live replay of a run directory on M ranks
};

// `moerr replay --model` of each of `steps`: the worst exit code of them.
CommandResult ModelReplays(const ReplayArgs& args, const formats::BundleReader& reader,
                           const std::vector<int64_t>& steps) {
  if (args.isolated || args.check || !args.policy.empty()) {
    return absl::InvalidArgumentError("--model does not combine with --isolated, --check or --policy");
  }
  if (!args.out.empty() && steps.size() != 1) {
    return absl::InvalidArgumentError("--out keeps one step's replay: pass one --step");
  }
  replayer::ModelReplayOptions model;
  model.routing_replay = !args.live_routing;
  if (!args.precision.empty()) {
    MOERR_ASSIGN_OR_RETURN(const moe::Precision precision, moe::ParsePrecision(args.precision));
    model.numerics = moe::Numerics{precision, false};
  }
  int exit_code = kExitOk;
  llvm::json::Array results;  // --json: one object per step
  for (int64_t step : steps) {
    const bool keep = !args.out.empty();
    model.record_path = keep ? args.out
                             : (std::filesystem::temp_directory_path() /
                                absl::StrFormat("moerr-model-replay-%d-%d.moerr", ::getpid(), step))
                                   .string();
    model.overwrite = !keep || args.force;
    llvm::json::Object result;
    const CommandResult code = ModelReplay(reader, step, model, args.json ? &result : nullptr);
    if (!keep) std::filesystem::remove(model.record_path);
    if (!code.ok()) return code.status();
    exit_code = std::max(exit_code, *code);
    results.push_back(std::move(result));
  }
  if (args.json) PrintJson(std::move(results));
  return exit_code;
}

// The program (or --isolated) replay of `step`, printed or added to
// `results`. A finding when it diverges from the record or, with --check,
// from itself.
CommandResult ProgramReplay(const ReplayArgs& args, const formats::BundleReader& reader, int64_t step,
                            const replayer::ReplayOptions& options, llvm::json::Array& results) {
  MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(reader, step));
  if (trace.ops.empty()) return NoOpsToReplay(reader, args.bundle, step);
  MOERR_ASSIGN_OR_RETURN(const replayer::ReplayReport report, replayer::ReplayTrace(reader, step, trace, options));
  int exit_code = report.first_divergence ? kExitFinding : kExitOk;
  for (const replayer::ReferenceCheck& c : report.reference_checks) {
    if (c.suspect) exit_code = kExitFinding;
  }
  ProgramResult result;
  result.report = &report;
  result.trace = &trace;
  result.isolated = args.isolated;
  if (!options.policy.empty()) {
    // Does the policy remove (or cause) an overflow?
    result.replayed = replayer::ReplayedTrace(trace, report, trace.ops.size());
    result.recorded_overflow = analysis::FindFirstOverflow(trace);
    result.policy_overflow = analysis::FindFirstOverflow(*result.replayed);
  }
  result.worst.resize(std::min<size_t>(report.errors.size(), 10));
  std::partial_sort_copy(report.errors.begin(), report.errors.end(), result.worst.begin(), result.worst.end(),
                         [](const auto& x, const auto& y) { return x.metrics.rel_l2 > y.metrics.rel_l2; });
  if (args.check) {
    MOERR_ASSIGN_OR_RETURN(const replayer::ReplayReport again, replayer::ReplayTrace(reader, step, trace, options));
    result.same = again.outputs == report.outputs;  // bitwise (Fingerprint::operator==)
    if (!*result.same) exit_code = kExitFinding;
  }
  if (args.json) {
    results.push_back(ProgramReplayJson(result));
  } else {
    PrintProgramReplay(result);
  }
  return exit_code;
}

// Replays every step asked of the bundle `args.bundle`: --model prints its
// own results; program replays add theirs to `results` (JSON) or print them.
CommandResult ReplayBundle(const ReplayArgs& args, llvm::json::Array& results) {
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.out, {args.bundle}));
  MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(args.bundle));
  replayer::ReplayOptions options;
  options.isolated = args.isolated;
  MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(args.references));
  options.references = &references;
  if (!args.policy.empty()) {
    MOERR_ASSIGN_OR_RETURN(options.policy, replayer::PrecisionPolicy::Load(args.policy));
  }
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, args.bundle, args.steps));
  if (args.model) return ModelReplays(args, *reader, steps);
  int exit_code = kExitOk;
  for (int64_t step : steps) {
    MOERR_ASSIGN_OR_RETURN(const int code, ProgramReplay(args, *reader, step, options, results));
    exit_code = std::max(exit_code, code);
  }
  return exit_code;
}

// A run directory: rank --rank alone, or every rank and then the cross-rank
// check of what they exchanged. Each rank's collectives come from its record.
// A rank whose bundle cannot be replayed (a stats bundle among full ones, a
// damaged one) is reported, with why, and the other ranks go on: a finding.
// --json: {"ranks": [{"rank": K, "steps": [...]} or {"rank": K, "error": WHY}],
// "cross_rank": [...]}.
CommandResult ReplayRun(const ReplayArgs& args) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<RankBundle> bundles, BundlesOf(args.bundle, args.rank));
  if (args.model || !args.out.empty()) {
    return absl::InvalidArgumentError("--model and --out replay one bundle: not a run directory");
  }
  // Bad options are the command's error, not a rank's.
  MOERR_RETURN_IF_ERROR(replayer::OpReferences::Load(args.references).status());
  if (!args.policy.empty()) MOERR_RETURN_IF_ERROR(replayer::PrecisionPolicy::Load(args.policy).status());
  int exit_code = kExitOk;
  llvm::json::Array ranks, checks;
  for (const RankBundle& b : bundles) {
    if (SkipUnfinished(b)) {
      exit_code = kExitFinding;
      continue;
    }
    ReplayArgs one = args;
    one.bundle = b.path;
    if (!args.json) std::printf("rank %lld (%s)\n", static_cast<long long>(b.rank), b.path.c_str());
    llvm::json::Array steps;
    const CommandResult code = ReplayBundle(one, steps);
    if (!code.ok() && ExitCodeOf(code.status()) == kExitError) {  // a bug in moerr still stops it
      exit_code = std::max(exit_code, kExitFinding);
      const std::string why(code.status().message());
      if (!args.json) std::printf("  rank %lld not replayed: %s\n", static_cast<long long>(b.rank), why.c_str());
      ranks.push_back(llvm::json::Object{{"rank", b.rank}, {"bundle", b.path}, {"error", why}});
      continue;
    }
    MOERR_RETURN_IF_ERROR(code.status());
    exit_code = std::max(exit_code, *code);
    ranks.push_back(llvm::json::Object{{"rank", b.rank}, {"bundle", b.path}, {"steps", std::move(steps)}});
  }
  if (args.rank < 0) {
    MOERR_ASSIGN_OR_RETURN(const int code,
                           CheckRunCollectives(args.bundle, args.steps, args.json ? &checks : nullptr));
    exit_code = std::max(exit_code, code);
  }
  if (args.json) PrintJson(llvm::json::Object{{"ranks", std::move(ranks)}, {"cross_rank", std::move(checks)}});
  return exit_code;
}

// --ranks M: the run's step re-executed on M ranks (replay_ranks.h).
CommandResult ReplayRunOnRanks(const ReplayArgs& args) {
  if (args.rank >= 0 || args.model || args.isolated || args.check || !args.policy.empty() ||
      !args.precision.empty() || args.live_routing || !args.references.empty()) {
    return absl::InvalidArgumentError(
        "--ranks re-executes the whole step on other ranks: it does not combine with --rank, --model, --isolated, "
        "--check, --policy, --precision, --live-routing or --reference");
  }
  ReplayRanksArgs ranks;
  ranks.run = args.bundle;
  ranks.steps = args.steps;
  ranks.ranks = args.ranks;
  ranks.out = args.out;
  ranks.force = args.force;
  ranks.json = args.json;
  return ReplayOnRanks(ranks);
}

CommandResult RunReplay(const ReplayArgs& args) {
  // A proxy run (moerr proxy RUN) records no ops: it runs on its ranks.
  if (args.ranks > 0 || (args.rank < 0 && IsProxyRun(args.bundle))) return ReplayRunOnRanks(args);
  if (formats::IsRunDirectory(args.bundle) || args.rank >= 0) return ReplayRun(args);
  llvm::json::Array results;  // --json: one object per step
  MOERR_ASSIGN_OR_RETURN(const int exit_code, ReplayBundle(args, results));
  if (args.json && !args.model) PrintJson(std::move(results));
  return exit_code;
}

}  // namespace

void AddReplayCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Re-execute recorded steps op by op from their leaves (or, --isolated, each op on its recorded inputs) "
      "and compare every output with the record");
  cmd->add_option("BUNDLE", opts->bundle, "A replayable or full bundle, or a multi-rank run directory (world.json)")
      ->required();
  cmd->add_option("--rank", opts->rank,
                  "Run directory: replay rank K alone (its collectives from the record); default every rank, then "
                  "check that what each rank received is what the others sent");
  cmd->add_option("--ranks", opts->ranks,
                  "Run directory: re-execute the step live on M ranks (M divides the run's ranks; 1: the whole world "
                  "in this process), each hosting the experts of the ranks it stands for, with the recorded routing "
                  "and batch; compare every expert's ops, the step's metrics and the first overflow with the record. "
                  "One step (--step, default the first rank 0 completed); --out DIR keeps the replay's run")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--step", opts->steps, "Steps to replay (default: every complete step)");
  cmd->add_flag("--check", opts->check, "Replay twice and demand bitwise equal results (determinism)");
  cmd->add_flag("--isolated", opts->isolated,
                "Run each op on its recorded inputs, so each op's error is its own (full bundles)");
  cmd->add_flag("--model", opts->model,
                "Model replay: rebuild the reference model and trainer from the bundle's state (replayable or full "
                "bundles of `moerr train --record`), force the recorded routing, run the step again and compare it "
                "op by op with the record");
  cmd->add_flag("--live-routing", opts->live_routing, "With --model: let the routers choose instead of the record");
  cmd->add_option("--precision", opts->precision, "With --model: train and roll out in fp32, bf16 or fp16-emu");
  cmd->add_option("--out", opts->out,
                  "With --model: keep the replayed step's recording here; with --ranks: the replay's run directory");
  cmd->add_flag("--force", opts->force, "With --out: overwrite an existing recording");
  cmd->add_flag("--json", opts->json, "Print the results as JSON, one object per step");
  cmd->add_option("--reference", opts->references,
                  "OP=FILE: run op OP (\"npu::npu_swiglu\") through the TorchScript reference FILE wherever it "
                  "appears; its forward takes the op's arguments (or its tensor arguments) in schema order. "
                  "moerr's shipped references load without it; with --isolated each recorded output is checked "
                  "against the reference's fp64 run");
  cmd->add_option("--policy", opts->policy,
                  "Precision policy file: lines \"module:PATH|tree:PATH|op:NAME fp32|fp64|round-fp16|"
                  "round-fp16-sat|round-bf16\"");
  OnRun(cmd, exit_code, [opts] { return RunReplay(*opts); });
}

}  // namespace moerr::tools
