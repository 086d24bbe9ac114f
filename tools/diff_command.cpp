#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "diff/diff_page.h"
#include "diff/trace_diff.h"
#include "diff/world_diff.h"
#include "formats/bundle_reader.h"
#include "formats/world_run.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

std::string OpLabel(const formats::OpEvent& op) {
  return absl::StrFormat("%s (%s, %s)", op.name, op.module.empty() ? "no module" : op.module,
                         formats::PhaseName(op.phase));
}

llvm::json::Object OutputJson(const diff::OutputDiff& o) {
  llvm::json::Object out{{"slot", static_cast<int64_t>(o.slot)},
                         {"dtype_a", std::string(formats::DTypeName(o.a_dtype))},
                         {"dtype_b", std::string(formats::DTypeName(o.b_dtype))},
                         {"error", JsonNumber(o.error)},
                         {"nan_mismatch", o.nan_mismatch},
                         {"inf_mismatch", o.inf_mismatch},
                         {"diverged", o.diverged},
                         {"compared_on", o.tensors ? "bytes" : "fingerprints"}};
  if (!o.note.empty()) out["note"] = o.note;
  // The statistic deltas (relative to A's L2); a statistic either side lacks
  // (an imported dump's unknown fields) counts 0.
  const diff::FingerprintDelta& f = o.fingerprints;
  out["statistics"] = llvm::json::Object{{"bitwise_equal", f.bitwise_equal},
                                         {"rel_l2", JsonNumber(f.rel_l2)},
                                         {"rel_abs_max", JsonNumber(f.rel_abs_max)},
                                         {"rel_mean", JsonNumber(f.rel_mean)}};
  if (const auto& m = o.tensors) {
    out["metrics"] = llvm::json::Object{{"cosine", JsonNumber(m->cosine)},     {"max_abs", JsonNumber(m->max_abs)},
                                        {"max_rel", JsonNumber(m->max_rel)},   {"mean_abs", JsonNumber(m->mean_abs)},
                                        {"rmse", JsonNumber(m->rmse)},         {"rel_l2", JsonNumber(m->rel_l2)},
                                        {"max_ulp", m->max_ulp},           {"within_0.1%", m->within_0p1},
                                        {"within_0.5%", m->within_0p5}};
  }
  return out;
}

struct DiffArgs {
  std::string a, b, html;
  int64_t step_a = -1, step_b = -1;
  std::vector<std::string> thresholds;
  size_t top = 10;
  int threads = 0;
  bool json = false, fingerprints_only = false;
};

llvm::json::Object DiffJson(const DiffArgs& args, const formats::Trace& a, int64_t step_a, const formats::Trace& b,
                            int64_t step_b, const diff::DiffReport& report) {
  llvm::json::Array diverged, unmatched;
  for (size_t i = 0; i < report.ops.size(); ++i) {
    const diff::OpDiff& d = report.ops[i];
    if (d.a < 0 || d.b < 0) {
      const formats::OpEvent& op = d.a >= 0 ? a.ops[d.a] : b.ops[d.b];
      unmatched.push_back(llvm::json::Object{{"in", d.a >= 0 ? "A" : "B"}, {"op_index", d.a >= 0 ? d.a : d.b},
                                             {"op", op.name}, {"module", op.module}});
      continue;
    }
    if (!d.diverged) continue;
    const formats::OpEvent& op = a.ops[d.a];
    llvm::json::Array outputs;
    for (const auto& o : d.outputs) outputs.push_back(OutputJson(o));
    diverged.push_back(llvm::json::Object{{"op_a", d.a}, {"op_b", d.b}, {"op", op.name}, {"module", op.module},
                                          {"phase", std::string(formats::PhaseName(op.phase))},
                                          {"error", JsonNumber(d.error)}, {"outputs", std::move(outputs)}});
  }
  return llvm::json::Object{{"a", args.a}, {"b", args.b}, {"step_a", step_a}, {"step_b", step_b},
                            {"matched", static_cast<int64_t>(report.matched)},
                            {"only_a", static_cast<int64_t>(report.only_a)},
                            {"only_b", static_cast<int64_t>(report.only_b)},
                            {"outputs_compared", static_cast<int64_t>(report.outputs_compared)},
                            {"tensors_compared", static_cast<int64_t>(report.tensors_compared)},
                            {"bytes_compared", report.bytes_compared},
                            {"diverged_ops", static_cast<int64_t>(report.diverged_ops)},
                            {"diverged", std::move(diverged)}, {"unmatched", std::move(unmatched)}};
}

// One line per diverged output of the first diverged op.
void PrintFirstDivergence(const diff::OpDiff& first, const formats::Trace& a) {
  std::printf("first divergence: op %lld of A / op %lld of B: %s\n", static_cast<long long>(first.a),
              static_cast<long long>(first.b), OpLabel(a.ops[first.a]).c_str());
  for (const auto& o : first.outputs) {
    if (!o.diverged) continue;
    std::printf("  output %zu (%s vs %s): rel. error %.3g", o.slot, std::string(formats::DTypeName(o.a_dtype)).c_str(),
                std::string(formats::DTypeName(o.b_dtype)).c_str(), o.error);
    if (o.tensors) {
      std::printf(", cosine %.6f, max abs %.3g, max rel %.3g, max ULP %llu, within 0.1%%: %.1f%%", o.tensors->cosine,
                  o.tensors->max_abs, o.tensors->max_rel, static_cast<unsigned long long>(o.tensors->max_ulp),
                  100 * o.tensors->within_0p1);
    } else {
      std::printf(" (from fingerprints, a lower bound: L2 %.3g, abs-max %.3g, mean %.3g)", o.fingerprints.rel_l2,
                  o.fingerprints.rel_abs_max, o.fingerprints.rel_mean);
    }
    if (o.nan_mismatch + o.inf_mismatch > 0) {
      std::printf(", %llu NaN and %llu Inf mismatches", static_cast<unsigned long long>(o.nan_mismatch),
                  static_cast<unsigned long long>(o.inf_mismatch));
    }
    if (!o.note.empty()) std::printf(", %s", o.note.c_str());
    std::printf("\n");
  }
}

void PrintDiff(const DiffArgs& args, const formats::Trace& a, const diff::DiffReport& report) {
  std::printf("%zu ops matched, %zu only in A, %zu only in B; %zu outputs compared (%zu on their bytes)\n",
              report.matched, report.only_a, report.only_b, report.outputs_compared, report.tensors_compared);
  if (!report.first_divergence) {
    std::printf("no divergence beyond the thresholds\n");
  } else {
    PrintFirstDivergence(report.ops[*report.first_divergence], a);
    std::printf("%zu ops diverged; the first %zu:\n", report.diverged_ops, std::min(args.top, report.diverged_ops));
    std::printf("  %6s %6s  %-24s %-40s %-9s %s\n", "op A", "op B", "name", "module", "phase", "rel. error");
    size_t shown = 0;
    for (const diff::OpDiff& d : report.ops) {
      if (!d.diverged || shown++ >= args.top) continue;
      const formats::OpEvent& op = a.ops[d.a];
      std::printf("  %6lld %6lld  %-24s %-40s %-9s %.3g\n", static_cast<long long>(d.a), static_cast<long long>(d.b),
                  op.name.c_str(), op.module.empty() ? "(none)" : op.module.c_str(),
                  std::string(formats::PhaseName(op.phase)).c_str(), d.error);
    }
  }
  if (!args.html.empty()) std::printf("HTML report: %s\n", args.html.c_str());
}

// Two run directories: rank by rank, or by module path when the world sizes
// differ (diff/world_diff.h). --json: {"parts": [{"what", "rank_a", "rank_b", ...}]}.
ExitOr RunWorldDiff(const DiffArgs& args, const diff::DiffOptions& options) {
  if (!args.html.empty()) return absl::InvalidArgumentError("--html compares two bundles: pass one rank's bundle of each");
  MOERR_ASSIGN_OR_RETURN(const formats::WorldStep a, formats::OpenWorldStep(args.a, args.step_a));
  MOERR_ASSIGN_OR_RETURN(const formats::WorldStep b, formats::OpenWorldStep(args.b, args.step_b));
  MOERR_ASSIGN_OR_RETURN(const std::vector<diff::WorldDiffPart> parts, diff::DiffWorlds(a, b, options));
  llvm::json::Array json;
  size_t diverged = 0;
  for (const diff::WorldDiffPart& p : parts) {
    diverged += p.report.diverged_ops;
    if (args.json) {
      llvm::json::Object o = DiffJson(args, p.a, a.step, p.b, b.step, p.report);
      o["what"] = p.what;
      o["rank_a"] = p.rank_a;
      o["rank_b"] = p.rank_b;
      json.push_back(std::move(o));
      continue;
    }
    std::printf("%s (rank %lld of A, rank %lld of B): ", p.what.c_str(), static_cast<long long>(p.rank_a),
                static_cast<long long>(p.rank_b));
    PrintDiff(args, p.a, p.report);
  }
  if (args.json) PrintJson(llvm::json::Object{{"a", args.a}, {"b", args.b}, {"parts", std::move(json)}});
  return diverged > 0 ? kExitFinding : kExitOk;
}

ExitOr RunDiff(const DiffArgs& args) {
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.html, {args.a, args.b}));
  diff::DiffOptions options;
  options.compare_bytes = !args.fingerprints_only;
  options.threads = args.threads;
  for (const std::string& t : args.thresholds) MOERR_RETURN_IF_ERROR(options.thresholds.Set(t));
  const bool run_a = formats::IsRunDirectory(args.a), run_b = formats::IsRunDirectory(args.b);
  if (run_a && run_b) return RunWorldDiff(args, options);
  if (run_a || run_b) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is a run directory and %s a bundle: compare two runs, or one rank's bundle (RUN/rankK.moerr) with a bundle",
        run_a ? args.a : args.b, run_a ? args.b : args.a));
  }
  MOERR_ASSIGN_OR_RETURN(const OpenedStep a, OpenStep(args.a, args.step_a));
  MOERR_ASSIGN_OR_RETURN(const OpenedStep b, OpenStep(args.b, args.step_b));
  MOERR_ASSIGN_OR_RETURN(const diff::DiffReport report,
                         diff::DiffTraces(*a.reader, a.trace, a.step, *b.reader, b.trace, b.step, options));
  if (!args.html.empty()) {
    MOERR_RETURN_IF_ERROR(
        diff::DiffPage(report, a.trace, b.trace, absl::StrFormat("moerr diff %s %s", args.a, args.b)).Write(args.html));
  }
  if (args.json) {
    PrintJson(DiffJson(args, a.trace, a.step, b.trace, b.step, report));
  } else {
    PrintDiff(args, a.trace, report);
  }
  return report.diverged_ops > 0 ? kExitFinding : kExitOk;
}

}  // namespace

void AddDiffCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<DiffArgs>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "Align two recordings of a step op by op and compare every output; the first divergence comes first");
  cmd->add_option("A", opts->a, "Reference bundle, or a multi-rank run directory")->required()->transform(RecordingPath());
  cmd->add_option("B", opts->b,
                  "Bundle to compare with it; for two runs: rank by rank, or expert by expert when their world sizes "
                  "differ")
      ->required()
      ->transform(RecordingPath());
  cmd->add_option("--step-a", opts->step_a, "Step of A (default: its first complete step)");
  cmd->add_option("--step-b", opts->step_b, "Step of B (default: its first complete step)");
  cmd->add_option("--threshold", opts->thresholds,
                  "Largest acceptable relative L2 error for outputs of a dtype, e.g. f32=1e-4 (defaults: f64 1e-9, "
                  "f32 1e-5, f16 2e-3, bf16 1.6e-2, integers 0)");
  cmd->add_flag("--fingerprints", opts->fingerprints_only, "Compare fingerprints only, even where bytes are recorded");
  cmd->add_option("--top", opts->top, "Diverged ops to list")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Threads comparing tensors on their bytes (default 0: one per core)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--html", opts->html, "Also write a self-contained HTML report here");
  cmd->add_flag("--json", opts->json, "Print JSON");
  OnRun(cmd, exit_code, [opts] { return RunDiff(*opts); });
}

}  // namespace moerr::tools
