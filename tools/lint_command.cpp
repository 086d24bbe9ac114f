#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "analysis/cross_rank.h"
#include "formats/bundle_reader.h"
#include "formats/world_run.h"
#include "replayer/vendor_check.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/run_directory.h"

namespace moerr::tools {
namespace {

llvm::json::Object FindingJson(const analysis::Finding& f) {
  llvm::json::Object o{{"check", f.check},
                       {"severity", std::string(analysis::SeverityName(f.severity))},
                       {"step", f.step},
                       {"where", f.where},
                       {"message", f.message},
                       {"numbers", llvm::json::Object(f.numbers)}};
  if (f.op_index >= 0) {
    o["op_index"] = f.op_index;
    o["op"] = f.op;
    o["phase"] = f.phase;
  }
  if (!f.next.empty()) o["next"] = f.next;
  if (f.rank >= 0) o["rank"] = f.rank;
  return o;
}

void Print(const analysis::Finding& f) {
  std::string where = f.op_index >= 0 ? absl::StrFormat("op %d %s in %s (%s)", f.op_index, f.op, f.where, f.phase)
                                      : f.where;
  if (f.rank >= 0) where = absl::StrFormat("rank %d, %s", f.rank, where);
  std::printf("  %-7s %-18s %s\n          %s\n", std::string(analysis::SeverityName(f.severity)).c_str(),
              f.check.c_str(), where.c_str(), f.message.c_str());
  if (!f.next.empty()) std::printf("          next: %s\n", f.next.c_str());
}

struct LintArgs {
  std::string bundle, against;
  std::vector<int64_t> steps;
  int64_t against_step = -1;
  std::vector<std::string> only;
  std::vector<std::string> references;  // --reference OP=FILE
  bool json = false, list = false;
};

// The findings of every step of `steps` that records ops; the steps that
// record none go to `opless`.
absl::StatusOr<std::vector<analysis::Finding>> LintSteps(const LintArgs& args, const formats::BundleReader& reader,
                                                         const std::vector<int64_t>& steps,
                                                         const std::optional<OpenedStep>& original,
                                                         const analysis::VendorOpJudge& vendor_ops,
                                                         std::vector<int64_t>& opless) {
  std::vector<analysis::Finding> all;
  for (int64_t step : steps) {
    MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(reader, step));
    if (trace.ops.empty()) {
      // A step for model replay (moerr proxy, moerr reduce): nothing to lint.
      opless.push_back(step);
      continue;
    }
    analysis::LintInput input{analysis::StepView{&reader, args.bundle, step, &trace}, std::nullopt};
    if (original) {
      input.original = analysis::StepView{original->reader.get(), args.against, original->step, &original->trace};
    }
    input.vendor_ops = &vendor_ops;
    MOERR_ASSIGN_OR_RETURN(const std::vector<analysis::Finding> found, analysis::RunChecks(input, args.only));
    all.insert(all.end(), found.begin(), found.end());
  }
  return all;
}

// A run directory: every rank's findings, tagged with the rank, then the
// checks of the run's steps (those rank 0 has) across its ranks.
absl::StatusOr<std::vector<analysis::Finding>> LintRun(const LintArgs& args, const std::optional<OpenedStep>& original,
                                                       const analysis::VendorOpJudge& vendor_ops,
                                                       std::vector<int64_t>& opless, size_t& steps_read) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<world::RankBundle> bundles, world::BundlesOf(args.bundle));
  const bool per_rank = analysis::SelectsAny(analysis::CheckScope::kStep, args.only);
  LintArgs one = args;
  std::vector<analysis::Finding> all;
  std::vector<int64_t> world_steps;
  for (const world::RankBundle& b : bundles) {
    if (world::SkipUnfinished(b)) continue;
    one.bundle = b.path;
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(b.path));
    MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, b.path, args.steps));
    if (b.rank == 0) world_steps = steps;
    steps_read += steps.size();
    if (!per_rank) continue;
    MOERR_ASSIGN_OR_RETURN(std::vector<analysis::Finding> findings,
                           LintSteps(one, *reader, steps, original, vendor_ops, opless));
    for (analysis::Finding& f : findings) f.rank = b.rank;
    all.insert(all.end(), findings.begin(), findings.end());
  }
  const bool across = analysis::SelectsAny(analysis::CheckScope::kRun, args.only);
  for (int64_t step : across ? world_steps : std::vector<int64_t>{}) {
    MOERR_ASSIGN_OR_RETURN(const formats::WorldStep world, formats::OpenWorldStep(args.bundle, step));
    analysis::LintInput input;
    input.world = &world;
    MOERR_ASSIGN_OR_RETURN(const std::vector<analysis::Finding> found, analysis::RunChecks(input, args.only));
    all.insert(all.end(), found.begin(), found.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return all;
}

void PrintFindings(const std::vector<analysis::Finding>& all, const int (&counts)[3]) {
  int64_t step = -2;
  for (const analysis::Finding& f : all) {
    if (f.step != step) std::printf("step %lld:\n", static_cast<long long>(step = f.step));
    Print(f);
  }
  std::printf("%zu findings: %d error%s, %d warning%s, %d note%s\n", all.size(), counts[2], counts[2] == 1 ? "" : "s",
              counts[1], counts[1] == 1 ? "" : "s", counts[0], counts[0] == 1 ? "" : "s");
}

CommandResult RunLint(const LintArgs& args) {
  if (args.list) {
    for (const auto& c : analysis::AllChecks()) {
      std::printf("%-20s %s\n", std::string(c->name()).c_str(), std::string(c->summary()).c_str());
    }
    return kExitOk;
  }
  if (args.bundle.empty()) return absl::InvalidArgumentError("lint needs a BUNDLE");
  MOERR_RETURN_IF_ERROR(analysis::CheckNamesExist(args.only));
  std::optional<OpenedStep> original;
  if (!args.against.empty()) {
    MOERR_ASSIGN_OR_RETURN(original, OpenStep(args.against, args.against_step));
  }
  MOERR_ASSIGN_OR_RETURN(replayer::OpReferences references, replayer::OpReferences::Load(args.references));
  const replayer::ReferenceJudge vendor_ops(std::move(references), args.references);
  std::vector<int64_t> opless;
  std::vector<analysis::Finding> all;
  size_t steps_read = 0;
  if (formats::IsRunDirectory(args.bundle)) {
    MOERR_ASSIGN_OR_RETURN(all, LintRun(args, original, vendor_ops, opless, steps_read));
  } else {
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(args.bundle));
    MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, args.bundle, args.steps));
    steps_read = steps.size();
    MOERR_ASSIGN_OR_RETURN(all, LintSteps(args, *reader, steps, original, vendor_ops, opless));
  }
  if (!opless.empty()) {
    const std::string hint = absl::StrFormat(
        "%s: step %d records no ops (a step to replay, as moerr proxy and moerr reduce write); `moerr replay %s "
        "--step %d --model --out R.moerr` records one to lint",
        args.bundle, opless.front(), args.bundle, opless.front());
    if (opless.size() == steps_read) return absl::FailedPreconditionError(hint);
    std::fprintf(stderr, "moerr: note: %s\n", hint.c_str());
  }
  int counts[3] = {0, 0, 0};
  for (const analysis::Finding& f : all) ++counts[static_cast<int>(f.severity)];
  if (args.json) {
    llvm::json::Array out;
    for (const analysis::Finding& f : all) out.push_back(FindingJson(f));
    PrintJson(std::move(out));
  } else {
    PrintFindings(all, counts);
  }
  return counts[1] + counts[2] > 0 ? kExitFinding : kExitOk;
}

}  // namespace

void AddLintCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<LintArgs>();
  CLI::App* cmd = app.add_subcommand(
      "lint", "Static checks over recorded steps, no re-run: dtype headroom, hazardous op patterns, routing "
              "fragility, load imbalance, optimizer hazards, proxy preservation; and on a full bundle vendor ops, "
              "re-run on their recorded inputs, against their references. Exits 1 on a warning or worse");
  cmd->add_option("BUNDLE", opts->bundle,
                  "A bundle (any mode; optimizer-state checks need replayable or full), or a multi-rank run directory: "
                  "every rank, and rank-imbalance, the rows each rank received in all_to_all")
      ->transform(RecordingPath());
  cmd->add_option("--step", opts->steps, "Steps to check (default: every complete step and every raised one)");
  cmd->add_option("--only", opts->only, "Run only this check (repeatable); --list names them");
  cmd->add_option("--against", opts->against, "The original bundle a proxy bundle is checked against");
  cmd->add_option("--against-step", opts->against_step, "Step of --against (default: its first complete step)");
  cmd->add_option("--reference", opts->references,
                  "OP=FILE: a TorchScript reference of op OP for vendor-op (as for moerr replay); moerr's shipped "
                  "references load without it");
  cmd->add_flag("--json", opts->json, "Print the findings as JSON");
  cmd->add_flag("--list", opts->list, "List the checks and exit");
  OnRun(cmd, exit_code, [opts] { return RunLint(*opts); });
}

}  // namespace moerr::tools
