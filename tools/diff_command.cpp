#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "diff/diff_page.h"
#include "diff/trace_diff.h"
#include "diff/world_diff.h"
#include "formats/bundle_reader.h"
#include "formats/world_run.h"
#include "replayer/introduced_error.h"
#include "support/progress.h"
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

// `options` binds --threshold, --fingerprints, --estimate and --threads,
// so their defaults are the library's.
struct DiffArgs {
  std::string a, b, html;
  int64_t step_a = -1, step_b = -1;
  size_t top = 10;
  bool json = false;
  replayer::PrecisionDiffOptions options;
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

llvm::json::Value SideJson(const diff::IntroducedSide& s) {
  if (!s.known) return nullptr;
  return llvm::json::Object{{"introduced", JsonNumber(s.introduced)}, {"rounding", JsonNumber(s.rounding)},
                            {"budget", JsonNumber(s.budget)}, {"beyond", s.Beyond()},
                            {"dtype", std::string(formats::DTypeName(s.dtype))}, {"slot", static_cast<int64_t>(s.slot)}};
}

llvm::json::Object PrecisionOpJson(const diff::PrecisionOp& p, const formats::Trace& a) {
  const formats::OpEvent& op = a.ops[p.a];
  return llvm::json::Object{{"op_a", p.a}, {"op_b", p.b}, {"op", op.name}, {"module", op.module},
                            {"phase", std::string(formats::PhaseName(op.phase))}, {"observed", JsonNumber(p.observed)},
                            {"inherited", JsonNumber(p.inherited)}, {"a", SideJson(p.sides[0])},
                            {"b", SideJson(p.sides[1])}, {"arguments", p.arguments},
                            {"arguments_after_item", p.item_pair.has_value()}, {"beyond", p.Beyond()}};
}

llvm::json::Object ProgramJson(const diff::ProgramDifference& d, const formats::Trace& a, const formats::Trace& b) {
  auto ops = [](const formats::Trace& t, const std::vector<int64_t>& indices) {
    llvm::json::Array out;
    for (int64_t i : indices) out.push_back(llvm::json::Object{{"op_index", i}, {"op", t.ops[i].name}, {"module", t.ops[i].module}});
    return out;
  };
  return llvm::json::Object{{"only_a", ops(a, d.only_a)}, {"only_b", ops(b, d.only_b)}};
}

// The verdict on introduced error, in --json: every judged op, the first
// difference, the largest introduced error.
llvm::json::Object IntroducedJson(const diff::PrecisionDiff& r, const formats::Trace& a, const formats::Trace& b) {
  llvm::json::Array ops, programs;
  for (const diff::PrecisionOp& p : r.ops) ops.push_back(PrecisionOpJson(p, a));
  for (const diff::ProgramDifference& d : r.programs) programs.push_back(ProgramJson(d, a, b));
  llvm::json::Value first = nullptr;
  if (r.ProgramFirst()) {
    first = llvm::json::Object{{"kind", "program"}, {"difference", ProgramJson(r.programs[*r.first_program], a, b)}};
  } else if (r.first_op) {
    first = llvm::json::Object{{"kind", r.ops[*r.first_op].arguments.empty() ? "introduced" : "arguments"},
                               {"op", PrecisionOpJson(r.ops[*r.first_op], a)}};
  }
  return llvm::json::Object{
      {"estimated", r.estimated}, {"estimated_because", r.estimated_because},
      {"budget_multiple", diff::kBudgetMultiple}, {"measured_a", static_cast<int64_t>(r.measured_a)},
      {"measured_b", static_cast<int64_t>(r.measured_b)}, {"within_rounding", !r.Found()},
      {"first", std::move(first)},
      {"largest", r.largest ? llvm::json::Value(PrecisionOpJson(r.ops[*r.largest], a)) : llvm::json::Value(nullptr)},
      {"program_differences", std::move(programs)}, {"ops", std::move(ops)}};
}

void PrintSide(const char* name, const diff::IntroducedSide& s, bool estimated) {
  if (!s.known) return;
  if (estimated) {
    std::printf("  the outputs differ by %.3g beyond their inputs' difference (an estimate; threshold %.3g)\n",
                s.introduced, s.budget);
    return;
  }
  std::printf("  %s introduces %.3g in output %zu (%s); budget %.3g (%gx this machine's run: %.3g)\n", name,
              s.introduced, s.slot, std::string(formats::DTypeName(s.dtype)).c_str(), s.budget, diff::kBudgetMultiple,
              s.rounding);
}

void PrintPrecisionOp(const char* title, const diff::PrecisionOp& p, const formats::Trace& a, bool estimated) {
  std::printf("%s: op %lld of A / op %lld of B: %s\n", title, static_cast<long long>(p.a), static_cast<long long>(p.b),
              OpLabel(a.ops[p.a]).c_str());
  if (!p.arguments.empty()) {
    std::printf("  the calls differ: %s%s\n", p.arguments.c_str(),
                p.item_pair ? " (perhaps a Python number computed from an earlier .item() of values that differ)" : "");
  }
  PrintSide("B", p.sides[1], estimated);
  PrintSide("A", p.sides[0], estimated);
  std::printf("  inherited from its inputs: %.3g; observed difference of its outputs: %.3g\n", p.inherited, p.observed);
}

// The coarsest floating dtype the judged ops' sides ran in: "bf16".
std::string CoarsestDType(const diff::PrecisionDiff& r) {
  auto coarseness = [](formats::DType d) {  // bits of precision, fewest last
    switch (d) {
      case formats::DType::kF64: return 0;
      case formats::DType::kF32: return 1;
      case formats::DType::kF16: return 2;
      case formats::DType::kBF16: return 3;
      default: return -1;
    }
  };
  std::optional<formats::DType> coarsest;
  for (const diff::PrecisionOp& p : r.ops) {
    for (const diff::IntroducedSide& s : p.sides) {
      if (s.known && (!coarsest || coarseness(s.dtype) > coarseness(*coarsest))) coarsest = s.dtype;
    }
  }
  return coarsest ? std::string(formats::DTypeName(*coarsest)) : "the dtypes'";
}

// The verdict on introduced error: the first difference, or that every
// difference is within rounding (and the largest introduced error).
void PrintIntroduced(const diff::PrecisionDiff& r, const formats::Trace& a, const formats::Trace& b) {
  if (r.estimated) {
    std::printf("introduced error estimated from fingerprints%s%s\n",
                r.estimated_because.empty() ? "" : ": isolated replay is not possible here (",
                r.estimated_because.empty() ? "" : (r.estimated_because + ")").c_str());
  } else {
    std::printf("introduced error: each op re-run in fp64 on its own recorded inputs (%zu ops of A, %zu of B)\n",
                r.measured_a, r.measured_b);
  }
  if (r.ProgramFirst()) {
    const diff::ProgramDifference& d = r.programs[*r.first_program];
    auto names = [](const formats::Trace& t, const std::vector<int64_t>& ops) {
      std::string out;
      for (int64_t i : ops) out += (out.empty() ? "" : ", ") + t.ops[i].name + " (op " + std::to_string(i) + ")";
      return out.empty() ? std::string("nothing") : out;
    };
    const formats::OpEvent& where = d.only_a.empty() ? b.ops[d.only_b[0]] : a.ops[d.only_a[0]];
    std::printf("first difference: the programs differ in %s (%s): A calls %s where B calls %s\n",
                where.module.empty() ? "no module" : where.module.c_str(),
                std::string(formats::PhaseName(where.phase)).c_str(), names(a, d.only_a).c_str(), names(b, d.only_b).c_str());
  } else if (r.first_op) {
    PrintPrecisionOp(r.estimated ? "first op introducing error beyond its threshold (estimate)"
                                 : "first op introducing error beyond its budget",
                     r.ops[*r.first_op], a, r.estimated);
  } else {
    std::printf("differences within %s rounding: no op introduces error beyond its %s\n", CoarsestDType(r).c_str(),
                r.estimated ? "threshold (estimate)" : "budget");
  }
  if (r.estimated && r.Found()) {
    std::printf("  (an estimate: a full recording of the suspect module, record(mode=\"full\"), gives the answer)\n");
  }
  if (!r.Found() && r.largest) PrintPrecisionOp("largest introduced error", r.ops[*r.largest], a, r.estimated);
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

void PrintDiff(const DiffArgs& args, const formats::Trace& a, const formats::Trace& b,
               const diff::PrecisionDiff& precision) {
  const diff::DiffReport& report = precision.observed;
  std::printf("%zu ops matched, %zu only in A, %zu only in B; %zu outputs compared (%zu on their bytes)\n",
              report.matched, report.only_a, report.only_b, report.outputs_compared, report.tensors_compared);
  PrintIntroduced(precision, a, b);
  std::printf("observed: ");
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
ExitOr RunWorldDiff(const DiffArgs& args, const replayer::PrecisionDiffOptions& options) {
  if (!args.html.empty()) return absl::InvalidArgumentError("--html compares two bundles: pass one rank's bundle of each");
  MOERR_ASSIGN_OR_RETURN(const formats::WorldStep a, formats::OpenWorldStep(args.a, args.step_a));
  MOERR_ASSIGN_OR_RETURN(const formats::WorldStep b, formats::OpenWorldStep(args.b, args.step_b));
  MOERR_ASSIGN_OR_RETURN(const std::vector<replayer::PrecisionPart> parts,
                         replayer::DiffWorldPrecisions(a, b, options));
  llvm::json::Array json;
  bool found = false;
  for (const replayer::PrecisionPart& p : parts) {
    found = found || p.precision.Found();
    if (args.json) {
      llvm::json::Object o = DiffJson(args, p.a, a.step, p.b, b.step, p.precision.observed);
      o["introduced"] = IntroducedJson(p.precision, p.a, p.b);
      o["what"] = p.what;
      o["rank_a"] = p.rank_a;
      o["rank_b"] = p.rank_b;
      json.push_back(std::move(o));
      continue;
    }
    std::printf("%s (rank %lld of A, rank %lld of B): ", p.what.c_str(), static_cast<long long>(p.rank_a),
                static_cast<long long>(p.rank_b));
    PrintDiff(args, p.a, p.b, p.precision);
  }
  if (args.json) PrintJson(llvm::json::Object{{"a", args.a}, {"b", args.b}, {"parts", std::move(json)}});
  return found ? kExitFinding : kExitOk;
}

ExitOr RunDiff(const DiffArgs& args) {
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.html, {args.a, args.b}));
  replayer::PrecisionDiffOptions options = args.options;
  PhasedProgress progress;
  options.progress = [&](const std::string& what) { progress.Update("diff: " + what, 0, 0); };
  const bool run_a = formats::IsRunDirectory(args.a), run_b = formats::IsRunDirectory(args.b);
  if (run_a && run_b) return RunWorldDiff(args, options);
  if (run_a || run_b) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is a run directory and %s a bundle: compare two runs, or one rank's bundle (RUN/rankK.moerr) with a bundle",
        run_a ? args.a : args.b, run_a ? args.b : args.a));
  }
  MOERR_ASSIGN_OR_RETURN(const OpenedStep a, OpenStep(args.a, args.step_a));
  MOERR_ASSIGN_OR_RETURN(const OpenedStep b, OpenStep(args.b, args.step_b));
  MOERR_ASSIGN_OR_RETURN(const diff::PrecisionDiff report,
                         replayer::DiffPrecisions(*a.reader, a.trace, a.step, *b.reader, b.trace, b.step, options));
  progress.Finish();
  if (!args.html.empty()) {
    MOERR_RETURN_IF_ERROR(
        diff::DiffPage(report, a.trace, b.trace, absl::StrFormat("moerr diff %s %s", args.a, args.b)).Write(args.html));
  }
  if (args.json) {
    llvm::json::Object o = DiffJson(args, a.trace, a.step, b.trace, b.step, report.observed);
    o["introduced"] = IntroducedJson(report, a.trace, b.trace);
    PrintJson(std::move(o));
  } else {
    PrintDiff(args, a.trace, b.trace, report);
  }
  return report.Found() ? kExitFinding : kExitOk;
}

}  // namespace

void AddDiffCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<DiffArgs>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "Align two recordings of a step op by op; name the first op that introduces error beyond its dtype's "
              "rounding (a wrong kernel, a changed argument, a changed program), then the observed divergence; exits 1 "
              "when there is one");
  cmd->add_option("A", opts->a, "Reference bundle, or a multi-rank run directory")->required()->transform(RecordingPath());
  cmd->add_option("B", opts->b,
                  "Bundle to compare with it; for two runs: rank by rank, or expert by expert when their world sizes "
                  "differ")
      ->required()
      ->transform(RecordingPath());
  cmd->add_option("--step-a", opts->step_a, "Step of A (default: its first complete step)");
  cmd->add_option("--step-b", opts->step_b, "Step of B (default: its first complete step)");
  diff::DiffOptions& diff = opts->options.diff;
  AddParsedOption(cmd, "--threshold",
                  [opts](const std::string& spec) { return opts->options.diff.thresholds.Set(spec); },
                  "Largest acceptable relative L2 error for outputs of a dtype, e.g. f32=1e-4; a pair is judged by "
                  "its lower precision (defaults: " + diff.thresholds.Text() + ", integers 0)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag_callback(
      "--fingerprints", [opts] { opts->options.diff.compare_bytes = false; },
      "Compare fingerprints only, even where bytes are recorded (introduced error is then estimated)");
  cmd->add_flag_callback(
      "--estimate", [opts] { opts->options.measure = false; },
      "Estimate each op's introduced error from the observed differences instead of re-running every op "
      "of two full recordings beside its fp64 run (faster, less certain)");
  cmd->add_option("--top", opts->top, "Diverged ops to list")->capture_default_str();
  cmd->add_option("--threads", diff.threads, "Threads comparing tensors on their bytes (default 0: one per core)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--html", opts->html, "Also write a self-contained HTML report here");
  cmd->add_flag("--json", opts->json, "Print JSON");
  OnRun(cmd, exit_code, [opts] { return RunDiff(*opts); });
}

}  // namespace moerr::tools
