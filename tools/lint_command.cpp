#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "analysis/finding_output.h"
#include "formats/bundle_reader.h"
#include "formats/world_run.h"
#include "replayer/vendor_check.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/run_directory.h"

namespace moerr::tools {
namespace {

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

ExitOr RunLint(const LintArgs& args) {
  if (args.list) {
    for (const auto& c : analysis::AllChecks()) {
      std::printf("%-20s %s\n", std::string(c->name()).c_str(), std::string(c->summary()).c_str());
    }
    return kExitOk;
  }
  if (args.bundle.empty()) return absl::InvalidArgumentError("lint needs a BUNDLE");
  MOERR_RETURN_IF_ERROR(analysis::CheckOnly(args.only, args.bundle, formats::IsRunDirectory(args.bundle)));
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
  if (args.json) {
    llvm::json::Array out;
    for (const analysis::Finding& f : all) out.push_back(analysis::FindingJson(f));
    PrintJson(std::move(out));
  } else {
    analysis::PrintFindings(all);
  }
  const bool warned = std::any_of(all.begin(), all.end(),
                                  [](const analysis::Finding& f) { return f.severity >= analysis::Severity::kWarning; });
  return warned ? kExitFinding : kExitOk;
}

}  // namespace

void AddLintCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<LintArgs>();
  CLI::App* cmd = app.add_subcommand(
      "lint", "Checks over recorded steps, each finding with its numbers and the command to run next; none re-runs "
              "the step (vendor-op re-runs single ops on their recorded inputs). --list names them. Exits 1 on a "
              "warning or worse");
  cmd->add_option("BUNDLE", opts->bundle,
                  "A bundle (any mode; optimizer-state checks need replayable or full), or a multi-rank run directory: "
                  "every rank, then rank-imbalance, the rows each rank received in all_to_all, and collective-order, the "
                  "first collective where the ranks of a group disagree")
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
