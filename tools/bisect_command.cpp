#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "analysis/world_overflow.h"
#include "formats/world_run.h"
#include "replayer/op_references.h"
#include "replayer/precision_bisect.h"
#include "support/progress.h"
#include "support/status.h"
#include "tools/command.h"
#include "tools/replay_ranks.h"
#include "tools/world_replay_report.h"
#include "tools/run_directory.h"
#include "tools/vendor_check.h"

namespace moerr::tools {
namespace {

// --precision: replays the step under upcast sets until a 1-minimal one that
// removes the overflow is found (dropping any module brings it back);
// prints it and writes it as a policy.
CommandResult RunPrecisionBisect(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                                 const analysis::OverflowOptions& overflow, const std::string& upcast,
                                 const std::string& policy_out, bool json, llvm::json::Array& results) {
  replayer::PrecisionBisectOptions options;
  options.overflow = overflow;
  options.upcast = replayer::ParsePolicyAction(upcast).value();
  Progress progress(absl::StrFormat("step %d: precision bisect", step), 0);
  options.on_trial = [&](size_t trial, size_t set) {
    progress.Update(static_cast<int64_t>(trial), absl::StrFormat("trial %d, %d modules upcast", trial, set));
  };
  auto result = replayer::PrecisionBisect(reader, step, trace, options);
  progress.Finish();
  if (!result.ok()) {
    if (result.status().code() != absl::StatusCode::kNotFound) return result.status();
    if (json) results.push_back(llvm::json::Object{{"step", step}, {"found", false}});
    else std::printf("step %lld: no overflowing op, nothing to bisect\n", static_cast<long long>(step));
    return kExitOk;
  }
  if (result->removable && !policy_out.empty()) {
    std::FILE* f = std::fopen(policy_out.c_str(), "w");
    const std::string text = absl::StrFormat("# moerr bisect --precision: upcasting these modules removes the overflow at "
                                             "op %d (%s, %s)\n# each line is a module's own ops, not its "
                                             "submodules'; dropping any one brings the overflow back\n%s",
                                             result->op_index, result->op, result->module, result->policy.ToText());
    const bool written = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = f != nullptr && std::fclose(f) == 0;
    if (!written || !closed) return absl::UnavailableError("cannot write policy file " + policy_out);
  }
  if (json) {
    llvm::json::Array modules;
    for (const auto& m : result->modules) modules.push_back(m);
    results.push_back(llvm::json::Object{
        {"step", step}, {"found", true}, {"op_index", static_cast<int64_t>(result->op_index)}, {"op", result->op},
        {"module", result->module}, {"phase", std::string(formats::PhaseName(result->phase))},
        {"candidates", static_cast<int64_t>(result->candidates.size())}, {"removable", result->removable},
        {"upcast", upcast}, {"modules", std::move(modules)}, {"trials", static_cast<int64_t>(result->trials)},
        {"policy", policy_out.empty() || !result->removable ? llvm::json::Value(nullptr) : llvm::json::Value(policy_out)}});
    return kExitFinding;
  }
  std::printf("step %lld: overflow at op %zu (%s, %s, %s phase)\n", static_cast<long long>(step), result->op_index,
              result->op.c_str(), result->module.empty() ? "no module" : result->module.c_str(),
              std::string(formats::PhaseName(result->phase)).c_str());
  if (!result->removable) {
    std::printf("  upcasting all %zu modules that run before it to %s does not remove it: not a precision problem "
                "of these modules\n", result->candidates.size(), upcast.c_str());
    return kExitFinding;
  }
  std::printf("  upcasting these %zu of %zu modules to %s removes it; dropping any one brings it back (%zu replays).\n"
              "  Each is the module's own ops, not its submodules': a module and its submodule are both listed when "
              "both are needed:\n",
              result->modules.size(), result->candidates.size(), upcast.c_str(), result->trials);
  for (const auto& m : result->modules) std::printf("    %s\n", m.c_str());
  if (!policy_out.empty()) std::printf("  policy written to %s (moerr replay --policy %s)\n", policy_out.c_str(), policy_out.c_str());
  return kExitFinding;
}

// One op of the chain as JSON (rises that are not numbers print as null).
llvm::json::Object LinkJson(const analysis::CauseLink& link) {
  return llvm::json::Object{{"op_index", static_cast<int64_t>(link.op_index)},
                            {"op", link.op->name},
                            {"module", link.op->module},
                            {"phase", std::string(formats::PhaseName(link.op->phase))},
                            {"output", static_cast<int64_t>(link.output)},
                            {"abs_max", JsonNumber(link.abs_max)},
                            {"input_rise_bits", JsonNumber(link.input_rise_bits)},
                            {"peer_rise_bits", JsonNumber(link.peer_rise_bits)},
                            {"peers", static_cast<int64_t>(link.peers)},
                            {"exploded", link.exploded}};
}

// "+18.4 bits over its computed inputs, +17.9 over 95 peers" (the parts known).
std::string Rises(const analysis::CauseLink& link) {
  std::vector<std::string> parts;
  if (std::isfinite(link.input_rise_bits)) {
    parts.push_back(absl::StrFormat("%+.1f bits over its computed inputs", link.input_rise_bits));
  }
  if (std::isfinite(link.peer_rise_bits)) {
    parts.push_back(absl::StrFormat("%+.1f bits over the median of %d peers", link.peer_rise_bits, link.peers));
  }
  return parts.empty() ? "no computed input, no peers" : absl::StrJoin(parts, ", ");
}

// The cause and the chain from it to the first overflow, as text. A long
// chain shows its first and last ops.
void PrintCause(const analysis::OverflowCause& found, size_t ops, int64_t step) {
  const analysis::CauseLink& cause = found.cause;
  auto where = [](const formats::OpEvent& op) {
    return absl::StrFormat("%s in %s (%s phase)", op.name, op.module.empty() ? "(no module)" : op.module,
                           formats::PhaseName(op.phase));
  };
  if (!found.found_explosion) {
    std::printf("step %lld: no op before the first overflow exploded; op %zu of %zu, %s, is its own cause\n",
                static_cast<long long>(step), cause.op_index, ops, where(*cause.op).c_str());
    return;
  }
  std::printf("step %lld: overflow caused by op %zu of %zu: %s\n", static_cast<long long>(step), cause.op_index, ops,
              where(*cause.op).c_str());
  std::printf("  its output's abs-max %.6g is %s\n", cause.abs_max, Rises(cause).c_str());
  std::printf("  chain from the cause to the first overflow (%zu ops):\n", found.chain.size());
  constexpr size_t kShown = 5;
  for (size_t k = 0; k < found.chain.size(); ++k) {
    if (found.chain.size() > 2 * kShown + 1 && k == kShown) {
      std::printf("    ... %zu more ops ...\n", found.chain.size() - 2 * kShown);
      k = found.chain.size() - kShown - 1;
      continue;
    }
    const analysis::CauseLink& link = found.chain[k];
    const bool last = k + 1 == found.chain.size();
    std::printf("    op %6zu %-24s %-22s %s, %s\n", link.op_index, link.op->name.c_str(),
                last ? "first overflow" : absl::StrFormat("abs-max %.6g", link.abs_max).c_str(),
                link.op->module.empty() ? "(no module)" : link.op->module.c_str(),
                std::string(formats::PhaseName(link.op->phase)).c_str());
  }
}

// The first overflow of `trace` as text: its output and the headroom trend.
void PrintFirstOverflow(const analysis::FirstOverflow& found, size_t ops, int64_t step) {
  const formats::OpEvent& op = *found.op;
  const formats::Fingerprint& f = found.fingerprint;
  std::printf("step %lld: first overflowing op %zu of %zu: %s\n", static_cast<long long>(step), found.op_index, ops,
              op.name.c_str());
  std::printf("  module %s, %s phase%s\n", op.module.empty() ? "(none)" : op.module.c_str(),
              std::string(formats::PhaseName(op.phase)).c_str(),
              found.forward_op ? absl::StrFormat(", backward of %s", found.forward_op->name).c_str() : "");
  // An imported dump's count may be a lower bound only (Fingerprint::unknown).
  auto count = [&f](uint64_t n, uint32_t field) { return absl::StrFormat("%s%d", f.Known(field) ? "" : ">=", n); };
  std::printf("  output: %llu values, %s +Inf, %s -Inf, %s NaN, finite abs-max %.6g (limit %.6g)\n",
              static_cast<unsigned long long>(f.numel), count(f.pos_inf, formats::Fingerprint::kPosInf).c_str(),
              count(f.neg_inf, formats::Fingerprint::kNegInf).c_str(), count(f.nan, formats::Fingerprint::kNan).c_str(),
              f.abs_max, found.limit);
  if (!found.trend.empty()) std::printf("  headroom before it (log2 of limit / abs-max):\n");
  for (const auto& p : found.trend) {
    std::printf("    op %6zu %-24s abs-max %-12.6g %6.1f bits%s\n", p.op_index, p.op->name.c_str(), p.abs_max,
                p.headroom_bits, p.op->module == op.module ? "" : ("  (" + p.op->module + ")").c_str());
  }
}

// The JSON of one step's result: the first overflow's keys (those of
// FindFirstOverflow), then "cause" and "chain".
llvm::json::Object CauseJson(const analysis::OverflowCause& found, int64_t step) {
  const formats::OpEvent& op = *found.first.op;
  const formats::Fingerprint& f = found.first.fingerprint;
  llvm::json::Array trend, chain;
  for (const auto& p : found.first.trend) {
    trend.push_back(llvm::json::Object{{"op_index", static_cast<int64_t>(p.op_index)}, {"op", p.op->name},
                                       {"module", p.op->module}, {"abs_max", JsonNumber(p.abs_max)},
                                       {"headroom_bits", JsonNumber(p.headroom_bits)}});
  }
  for (const auto& link : found.chain) chain.push_back(LinkJson(link));
  llvm::json::Object cause = LinkJson(found.cause);
  cause["found_explosion"] = found.found_explosion;
  return llvm::json::Object{
      {"step", step}, {"found", true}, {"op_index", static_cast<int64_t>(found.first.op_index)}, {"op", op.name},
      {"module", op.module}, {"phase", std::string(formats::PhaseName(op.phase))},
      {"forward_op",
       found.first.forward_op ? llvm::json::Value(found.first.forward_op->name) : llvm::json::Value(nullptr)},
      {"pos_inf", f.pos_inf}, {"neg_inf", f.neg_inf}, {"nan", f.nan}, {"numel", f.numel},
      {"abs_max", JsonNumber(f.abs_max)}, {"limit", found.first.limit}, {"trend", std::move(trend)},
      {"cause", std::move(cause)}, {"chain", std::move(chain)}};
}

// The default bisect of one step: the first overflow and its cause. The
// step before it, when the bundle holds it, adds peers.
CommandResult RunCauseBisect(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                             const analysis::OverflowOptions& options, bool json, llvm::json::Array& results) {
  std::optional<formats::Trace> before;
  const std::vector<int64_t> complete = reader.CompleteSteps();
  if (std::find(complete.begin(), complete.end(), step - 1) != complete.end()) {
    MOERR_ASSIGN_OR_RETURN(before, formats::ReadTrace(reader, step - 1));
  }
  const auto found = analysis::FindOverflowCause(trace, options, {before ? &*before : nullptr});
  if (!found) {
    if (json) {
      results.push_back(
          llvm::json::Object{{"step", step}, {"found", false}, {"ops", static_cast<int64_t>(trace.ops.size())}});
    } else if (trace.ops.empty()) {
      // A proxy's step, or a crashed one whose ops were lost.
      std::printf("step %lld: records no ops, nothing to search\n", static_cast<long long>(step));
    } else {
      std::printf("step %lld: no overflowing op in %zu ops\n", static_cast<long long>(step), trace.ops.size());
    }
    return kExitOk;
  }
  if (json) {
    results.push_back(CauseJson(*found, step));
  } else {
    PrintCause(*found, trace.ops.size(), step);
    PrintFirstOverflow(found->first, trace.ops.size(), step);
  }
  return kExitFinding;
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
  for (const replayer::ReferenceCheck& c : check.suspect) {
    std::printf("step %lld: %svendor op suspect: %s\n", n, prefix.c_str(), DescribeVendorOp(c, trace).c_str());
  }
}

// After the cause: the verdict on the step's vendor ops, those with a
// reference (tools/vendor_check.h), printed or added to the step's JSON
// `result` as "vendor_ops". Silent when no op has one. kExitFinding when an
// op is suspect.
int ReportVendorOps(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                    const replayer::OpReferences& references, llvm::json::Object* result) {
  const VendorCheck check = CheckVendorOps(reader, step, trace, references);
  if (result != nullptr) {
    llvm::json::Array ops;
    for (const replayer::ReferenceCheck& c : check.suspect) ops.push_back(VendorOpJson(c, trace));
    if (check.checked_ops > 0) (*result)["vendor_ops"] = std::move(ops);
    if (!check.skipped.empty()) (*result)["vendor_ops_skipped"] = check.skipped;
  } else {
    PrintVendorCheck(check, step, trace, "");
  }
  return check.suspect.empty() ? kExitOk : kExitFinding;
}

// A run directory: the same verdict for each rank that has the step read
// into `world`, its lines prefixed "rank K: "; in JSON, "vendor_ops" holds
// every rank's suspect ops, each with its "rank", and "vendor_ops_skipped"
// one {"rank", "reason"} per rank not checked.
int ReportRankVendorOps(const formats::WorldStep& world, const replayer::OpReferences& references,
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
    for (const replayer::ReferenceCheck& c : check.suspect) {
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

// Where the overflow went from its origin, and each rank's own first overflow.
void PrintWorldOverflow(const analysis::WorldOverflow& found) {
  if (found.spread) {
    std::vector<std::string> reached;
    for (int64_t r : found.reached) reached.push_back(absl::StrFormat("%d", r));
    std::printf("  spread: rank %lld sent non-finite values in %s%s%s\n", static_cast<long long>(found.rank),
                formats::DescribeCollective(*found.spread, found.spread_module).c_str(),
                reached.empty() ? "" : " -> ranks ", absl::StrJoin(reached, ", ").c_str());
  }
  for (const analysis::RankOverflow& r : found.ranks) {
    std::printf("  rank %lld: first overflow at op %zu, %s in %s%s\n", static_cast<long long>(r.rank), r.op_index,
                r.op->name.c_str(), r.op->module.empty() ? "(no module)" : r.op->module.c_str(),
                r.arrived ? " (arrived from another rank)" : "");
  }
}

llvm::json::Object WorldOverflowJson(const analysis::WorldOverflow& found, int64_t step) {
  llvm::json::Object out = CauseJson(found.cause, step);
  out["rank"] = found.rank;
  llvm::json::Array ranks;
  for (const analysis::RankOverflow& r : found.ranks) {
    ranks.push_back(llvm::json::Object{{"rank", r.rank}, {"op_index", static_cast<int64_t>(r.op_index)},
                                       {"op", r.op->name}, {"module", r.op->module}, {"arrived", r.arrived}});
  }
  out["ranks"] = std::move(ranks);
  if (found.spread) {
    out["spread"] = llvm::json::Object{{"kind", found.spread->kind},   {"group", found.spread->group},
                                       {"seq", found.spread->seq},     {"module", found.spread_module},
                                       {"from", found.rank},           {"to", llvm::json::Array(found.reached)}};
  }
  return out;
}

// A run directory: each step's first overflow in causal order across the
// ranks (analysis/world_overflow.h), with its rank, cause and spread; then
// each rank's vendor ops against their references (ReportRankVendorOps).
CommandResult RunWorldBisect(const std::string& dir, std::vector<int64_t> steps,
                             const analysis::OverflowOptions& options, const replayer::OpReferences& references,
                             bool json) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(dir));
  const std::optional<llvm::json::Object> proxy = ProxyOfRun(world);
  MOERR_ASSIGN_OR_RETURN(steps, RunSteps(world, steps));
  llvm::json::Array results;
  int exit_code = kExitOk;
  for (int64_t step : steps) {
    MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
    const std::optional<analysis::WorldOverflow> found = analysis::FindWorldOverflow(world, options);
    llvm::json::Object result;
    if (!found) {
      if (json) result = llvm::json::Object{{"step", step}, {"found", false}};
      else std::printf("step %lld: no overflowing op on any of %zu ranks\n", static_cast<long long>(step),
                       world.ranks.size());
    } else if (json) {
      exit_code = kExitFinding;
      result = WorldOverflowJson(*found, step);
      if (const auto original = proxy ? OriginalOf(*proxy, found->cause.first.op->module) : std::nullopt) {
        result["proxy_rank"] = original->proxy_rank;
        result["original_expert"] = original->expert;
        result["original_rank"] = original->rank;
      }
    } else {
      exit_code = kExitFinding;
      const formats::Trace& trace = *world.ranks[static_cast<size_t>(found->rank)].trace;
      std::printf("step %lld: the overflow began on rank %lld of %zu\n", static_cast<long long>(step),
                  static_cast<long long>(found->rank), world.ranks.size());
      PrintCause(found->cause, trace.ops.size(), step);
      PrintWorldOverflow(*found);
      if (const auto original = proxy ? OriginalOf(*proxy, found->cause.first.op->module) : std::nullopt) {
        std::printf("  the proxy's expert is on proxy rank %lld and stands for the original's expert %lld of layer "
                    "%lld, hosted by original rank %lld\n",
                    static_cast<long long>(original->proxy_rank), static_cast<long long>(original->expert),
                    static_cast<long long>(original->layer), static_cast<long long>(original->rank));
      }
    }
    exit_code = std::max(exit_code, ReportRankVendorOps(world, references, json ? &result : nullptr));
    if (json) results.push_back(std::move(result));
  }
  if (json) PrintJson(std::move(results));
  return exit_code;
}

// A proxy run (moerr proxy RUN) records no ops: its step is replayed in
// this process (its ranks as one; the placement still names the proxy rank
// of each expert) into a temporary run, which is bisected.
CommandResult BisectProxyRun(const std::string& dir, const std::vector<int64_t>& steps,
                             const analysis::OverflowOptions& options, const replayer::OpReferences& references,
                             bool json) {
  if (steps.size() > 1) return absl::InvalidArgumentError("a proxy run holds one step: pass one --step");
  char tmp[] = "/tmp/moerr-bisect-XXXXXX";
  if (::mkdtemp(tmp) == nullptr) return absl::UnavailableError("cannot create a temporary directory");
  if (!json) std::printf("%s is a proxy run: its step is replayed in this process to find its ops\n", dir.c_str());
  const absl::Status replayed = ReplayInProcess(dir, steps.empty() ? -1 : steps[0], tmp);
  CommandResult result = replayed.ok() ? RunWorldBisect(tmp, steps, options, references, json) : replayed;
  std::filesystem::remove_all(tmp);
  return result;
}

}  // namespace

void AddBisectCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, limit = "dtype";
    std::vector<int64_t> steps;
    double fraction = 0;
    bool json = false, precision = false;
    std::string upcast = "fp32", policy_out = "precision-policy.txt";
    std::vector<std::string> references;  // --reference OP=FILE
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bisect", "Find the first overflowing op and its cause, the op before it whose output exploded, from the "
      "recorded fingerprints alone (any bundle, stats too); with --precision, a set of modules whose upcast "
      "removes the overflow, none of which can be dropped (1-minimal). On a full bundle, ops with a reference "
      "(vendor ops) are also run on their recorded inputs and judged against it");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file, or a multi-rank run directory (world.json)")->required()
      ->transform(RecordingPath());
  cmd->add_option("--step", opts->steps, "Steps to search (default: every complete step and every raised one)");
  cmd->add_option("--limit", opts->limit, "Range to judge outputs against: dtype, fp16 or bf16")
      ->check(CLI::IsMember({"dtype", "fp16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--fraction", opts->fraction,
                  "Also count outputs whose abs-max exceeds this fraction of the limit (0: only non-finite)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--precision", opts->precision,
                "Replay the step to find a set of modules whose upcast removes the overflow, none of which can be "
                "dropped (replayable or full bundles)");
  cmd->add_option("--upcast", opts->upcast, "With --precision: the precision to upcast to")
      ->check(CLI::IsMember({"fp32", "fp64"}))
      ->capture_default_str();
  cmd->add_option("--policy-out", opts->policy_out, "With --precision: where to write the set as a policy file")
      ->capture_default_str();
  cmd->add_option("--reference", opts->references,
                  "OP=FILE: a TorchScript reference of op OP (as for moerr replay); on a full bundle, each op with a "
                  "reference (moerr's shipped ones load without it) is run on its recorded inputs and a recorded "
                  "output further from the reference's fp64 run than its dtype explains is reported");
  cmd->add_flag("--json", opts->json, "Print JSON");
  OnRun(cmd, exit_code, [opts]() -> CommandResult {
    analysis::OverflowOptions options;
    options.fraction = opts->fraction;
    options.limit = opts->limit == "fp16"   ? analysis::DTypeMax(formats::DType::kF16)
                    : opts->limit == "bf16" ? analysis::DTypeMax(formats::DType::kBF16)
                                            : 0;
    if (formats::IsRunDirectory(opts->bundle)) {
      if (opts->precision) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--precision replays one rank's bundle: pass %s/rank<K>.moerr of the rank bisect names", opts->bundle));
      }
      MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(opts->references));
      if (IsProxyRun(opts->bundle)) return BisectProxyRun(opts->bundle, opts->steps, options, references, opts->json);
      return RunWorldBisect(opts->bundle, opts->steps, options, references, opts->json);
    }
    if (opts->precision) MOERR_RETURN_IF_ERROR(CheckNotAnInput(opts->policy_out, {opts->bundle}));
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(opts->bundle));
    MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, opts->bundle, opts->steps));
    MOERR_ASSIGN_OR_RETURN(const replayer::OpReferences references, replayer::OpReferences::Load(opts->references));
    llvm::json::Array results;
    int exit_code = kExitOk;
    for (int64_t step : steps) {
      MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(*reader, step));
      MOERR_ASSIGN_OR_RETURN(const std::string raised, RaisedLine(*reader, step));
      if (!raised.empty() && !opts->json) std::printf("%s\n", raised.c_str());
      MOERR_ASSIGN_OR_RETURN(
          const int code,
          opts->precision
              ? RunPrecisionBisect(*reader, step, trace, options, opts->upcast, opts->policy_out, opts->json, results)
              : RunCauseBisect(*reader, step, trace, options, opts->json, results));
      exit_code = std::max(exit_code, code);
      if (!raised.empty() && opts->json && !results.empty()) {
        if (llvm::json::Object* o = results.back().getAsObject()) o->try_emplace("raised", raised);
      }
      if (opts->precision) continue;
      exit_code = std::max(exit_code, ReportVendorOps(*reader, step, trace, references,
                                                      opts->json ? results.back().getAsObject() : nullptr));
    }
    if (opts->json) PrintJson(std::move(results));
    return exit_code;
  });
}

}  // namespace moerr::tools
