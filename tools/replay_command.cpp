#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/first_overflow.h"
#include "diff/trace_diff.h"
#include "formats/annotations.h"
#include "formats/bundle_reader.h"
#include "formats/module_path.h"
#include "formats/world_manifest.h"
#include "replayer/model_replay.h"
#include "replayer/program_replay.h"
#include "replayer/program_result.h"
#include "replayer/step_failure.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/replay_ranks.h"
#include "world/run_directory.h"
#include "world/world_replay_comparison.h"

namespace moerr::tools {
namespace {


// For a proxy bundle's expert module: " (the original's expert N)", read
// from the bundle's "proxy" annotation; otherwise "".
std::string OriginalExpert(const formats::BundleReader& reader, const std::string& module) {
  const auto expert = formats::ExpertOf(module);
  absl::StatusOr<llvm::json::Object> info = formats::ReadObjectAnnotation(reader, formats::kProxyAnnotation, -1, "");
  if (!expert || !info.ok()) return "";
  if (const auto original = formats::ProxyKeptExpert(*info, expert->first, expert->second)) {
    return absl::StrFormat(" (the original's expert %d)", *original);
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
      llvm::json::Object o = replayer::OpJson(first->op_index, *first->op);
      o["original_expert"] = OriginalExpert(reader, first->op->module);
      where = std::move(o);
    }
    (*json)["first_overflow"] = std::move(where);
  } else {
    std::printf("  the bundle records no ops to compare with (a proxy bundle); first overflow of the replay: %s\n",
                first ? absl::StrFormat("op %d %s%s", first->op_index, replayer::Where(*first->op),
                                        OriginalExpert(reader, first->op->module))
                            .c_str()
                      : "none");
  }
  return first ? kExitFinding : kExitOk;
}

// The record `a` and the replay `b` of `step`, compared op by op. A finding
// when they diverge or do not align.
ExitOr CompareWithRecord(const formats::BundleReader& reader, const formats::Trace& a,
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
      llvm::json::Object o = replayer::OpJson(op.a, a.ops[op.a]);
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
                  replayer::Where(a.ops[first.a]).c_str(), first.error);
    }
  }
  return d.diverged_ops > 0 || d.only_a + d.only_b > 0 ? kExitFinding : kExitOk;
}

// `moerr replay --model`: runs the step again on a rebuilt model, records it
// to `options.record_path` and compares it op by op with the record; prints
// what it found, or puts it in `json` when given.
ExitOr ModelReplay(const formats::BundleReader& reader, int64_t step, replayer::ModelReplayOptions options,
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


// Why step `step` of `path`, which records no ops, has nothing to
// re-dispatch: the step bundles `moerr proxy` (marked by its "proxy"
// annotation) and `moerr reduce` write hold a model's state and routing,
// which model replay runs.
absl::Status NoOpsToReplay(const formats::BundleReader& reader, const std::string& path, int64_t step) {
  if (reader.ReadAnnotation(formats::kProxyAnnotation).ok()) {
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
  // BUNDLE, --step, --out, --force and --json (every mode's) bind here, and
  // so do --ranks M (a run directory's step on M ranks) and
  // --collective-timeout: what `world::ReplayOnRanks` takes as it is.
  world::ReplayRanksArgs base;
  bool check = false, isolated = false, model = false, live_routing = false;
  std::string policy, precision;
  std::vector<std::string> references;  // --reference OP=FILE
  int64_t rank = -1;                      // --rank K of a run directory
};

// `moerr replay --model` of each of `steps`: the worst exit code of them.
ExitOr ModelReplays(const ReplayArgs& args, const formats::BundleReader& reader,
                           const std::vector<int64_t>& steps) {
  if (args.isolated || args.check || !args.policy.empty()) {
    return absl::InvalidArgumentError("--model does not combine with --isolated, --check or --policy");
  }
  if (!args.base.out.empty() && steps.size() != 1) {
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
    const bool keep = !args.base.out.empty();
    model.record_path = keep ? args.base.out
                             : (std::filesystem::temp_directory_path() /
                                absl::StrFormat("moerr-model-replay-%d-%d.moerr", ::getpid(), step))
                                   .string();
    model.overwrite = !keep || args.base.force;
    llvm::json::Object result;
    const ExitOr code = ModelReplay(reader, step, model, args.base.json ? &result : nullptr);
    if (!keep) std::filesystem::remove(model.record_path);
    if (!code.ok()) return code.status();
    exit_code = std::max(exit_code, *code);
    results.push_back(std::move(result));
  }
  if (args.base.json) PrintJson(std::move(results));
  return exit_code;
}

// The program (or --isolated) replay of `step`, printed or added to
// `results`. A finding when it diverges from the record or, with --check,
// from itself.
ExitOr ProgramReplay(const ReplayArgs& args, const formats::BundleReader& reader, int64_t step,
                            const replayer::ReplayOptions& options, llvm::json::Array& results) {
  MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(reader, step));
  if (trace.ops.empty()) return NoOpsToReplay(reader, args.base.run, step);
  // A raised step replays up to its last recorded op, where the original stopped.
  MOERR_ASSIGN_OR_RETURN(const std::string raised, RaisedLine(reader, step));
  if (!raised.empty() && !args.base.json) {
    std::printf("%s\n  replaying its %zu recorded ops, up to where the original step stopped\n", raised.c_str(),
                trace.ops.size());
  }
  MOERR_ASSIGN_OR_RETURN(const replayer::ReplayReport report, replayer::ReplayTrace(reader, step, trace, options));
  int exit_code = report.first_divergence ? kExitFinding : kExitOk;
  for (const replayer::ReferenceCheck& c : report.reference_checks) {
    if (c.suspect) exit_code = kExitFinding;
  }
  replayer::ProgramResult result;
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
  if (args.base.json) {
    llvm::json::Object json = replayer::ProgramReplayJson(result);
    if (!raised.empty()) json["raised"] = raised;
    results.push_back(std::move(json));
  } else {
    replayer::PrintProgramReplay(result);
  }
  return exit_code;
}

// Replays every step asked of the bundle `args.base.run`: --model prints its
// own results; program replays add theirs to `results` (JSON) or print them.
ExitOr ReplayBundle(const ReplayArgs& args, llvm::json::Array& results) {
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(args.base.out, {args.base.run}));
  MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(args.base.run));
  replayer::ReplayOptions options;
  options.isolated = args.isolated;
  MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(args.references));
  options.references = &references;
  if (!args.policy.empty()) {
    MOERR_ASSIGN_OR_RETURN(options.policy, replayer::PrecisionPolicy::Load(args.policy));
  }
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, args.base.run, args.base.steps));
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
ExitOr ReplayRun(const ReplayArgs& args) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<world::RankBundle> bundles, world::BundlesOf(args.base.run, args.rank));
  if (args.model || !args.base.out.empty()) {
    return absl::InvalidArgumentError("--model and --out replay one bundle: not a run directory");
  }
  // Bad options are the command's error, not a rank's.
  MOERR_RETURN_IF_ERROR(replayer::OpReferences::Load(args.references).status());
  if (!args.policy.empty()) MOERR_RETURN_IF_ERROR(replayer::PrecisionPolicy::Load(args.policy).status());
  int exit_code = kExitOk;
  llvm::json::Array ranks, checks;
  for (const world::RankBundle& b : bundles) {
    if (world::SkipUnfinished(b)) {
      exit_code = kExitFinding;
      continue;
    }
    ReplayArgs one = args;
    one.base.run = b.path;
    if (!args.base.json) std::printf("rank %lld (%s)\n", static_cast<long long>(b.rank), b.path.c_str());
    llvm::json::Array steps;
    const ExitOr code = ReplayBundle(one, steps);
    if (!code.ok() && ExitCodeOf(code.status()) == kExitError) {  // a bug in moerr still stops it
      exit_code = std::max(exit_code, kExitFinding);
      const std::string why(code.status().message());
      if (!args.base.json) std::printf("  rank %lld not replayed: %s\n", static_cast<long long>(b.rank), why.c_str());
      ranks.push_back(llvm::json::Object{{"rank", b.rank}, {"bundle", b.path}, {"error", why}});
      continue;
    }
    MOERR_RETURN_IF_ERROR(code.status());
    exit_code = std::max(exit_code, *code);
    ranks.push_back(llvm::json::Object{{"rank", b.rank}, {"bundle", b.path}, {"steps", std::move(steps)}});
  }
  if (args.rank < 0) {
    MOERR_ASSIGN_OR_RETURN(const int code,
                           world::CheckRunCollectives(args.base.run, args.base.steps, args.base.json ? &checks : nullptr));
    exit_code = std::max(exit_code, code);
  }
  if (args.base.json) PrintJson(llvm::json::Object{{"ranks", std::move(ranks)}, {"cross_rank", std::move(checks)}});
  return exit_code;
}

// --ranks M: the run's step re-executed on M ranks (replay_ranks.h).
ExitOr ReplayRunOnRanks(const ReplayArgs& args) {
  if (args.rank >= 0 || args.model || args.isolated || args.check || !args.policy.empty() ||
      !args.precision.empty() || args.live_routing || !args.references.empty()) {
    return absl::InvalidArgumentError(
        "--ranks re-executes the whole step on other ranks: it does not combine with --rank, --model, --isolated, "
        "--check, --policy, --precision, --live-routing or --reference");
  }
  return world::ReplayOnRanks(args.base);
}

ExitOr RunReplay(const ReplayArgs& args) {
  // A proxy run (moerr proxy RUN) records no ops: it runs on its ranks.
  if (args.base.ranks > 0 || (args.rank < 0 && world::IsProxyRun(args.base.run))) return ReplayRunOnRanks(args);
  if (formats::IsRunDirectory(args.base.run) || args.rank >= 0) return ReplayRun(args);
  llvm::json::Array results;  // --json: one object per step
  MOERR_ASSIGN_OR_RETURN(const int exit_code, ReplayBundle(args, results));
  if (args.base.json && !args.model) PrintJson(std::move(results));
  return exit_code;
}

}  // namespace

void AddReplayCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Re-execute recorded steps op by op from their leaves (or, --isolated, each op on its recorded inputs) "
      "and compare every output with the record");
  cmd->add_option("BUNDLE", opts->base.run, "A replayable or full bundle, or a multi-rank run directory (world.json)")
      ->required()
      ->transform(RecordingPath());
  cmd->add_option("--rank", opts->rank,
                  "Run directory: replay rank K alone (its collectives from the record); default every rank, then "
                  "check that what each rank received is what the others sent");
  cmd->add_option("--ranks", opts->base.ranks,
                  "Run directory: re-execute the step live on M ranks (M divides the run's ranks; 1: the whole world "
                  "in this process), each hosting the experts of the ranks it stands for, with the recorded routing "
                  "and batch; compare every expert's ops, the step's metrics, the first overflow and the run's failure "
                  "(rank by rank) with the record. "
                  "One step (--step, default the first rank 0 completed); --out DIR keeps the replay's run. "
                  "A Python loop recorded with moerr.record(model=, hf_config=): its HF-layout model rebuilt, each "
                  "rank's layer outputs, loss and gradients compared within a relative 1e-4 (docs/DISTRIBUTED.md)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--collective-timeout", opts->base.collective_timeout_s,
                  "With --ranks (or a proxy run): seconds a collective (and the rendezvous) may take before the "
                  "replay rank fails naming it")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--step", opts->base.steps, "Steps to replay (default: every complete step and every raised one)");
  cmd->add_flag("--check", opts->check, "Replay twice and demand bitwise equal results (determinism)");
  cmd->add_flag("--isolated", opts->isolated,
                "Run each op on its recorded inputs, so each op's error is its own (full bundles)");
  cmd->add_flag("--model", opts->model,
                "Model replay: rebuild the reference model and trainer from the bundle's state (replayable or full "
                "bundles of `moerr train --record`), force the recorded routing, run the step again and compare it "
                "op by op with the record");
  cmd->add_flag("--live-routing", opts->live_routing, "With --model: let the routers choose instead of the record");
  cmd->add_option("--precision", opts->precision, "With --model: train and roll out in fp32, bf16, fp16 or fp16-emu");
  cmd->add_option("--out", opts->base.out,
                  "With --model: keep the replayed step's recording here; with --ranks: the replay's run directory");
  cmd->add_flag("--force", opts->base.force, "With --out: overwrite an existing recording");
  cmd->add_flag("--json", opts->base.json, "Print the results as JSON, one object per step");
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
