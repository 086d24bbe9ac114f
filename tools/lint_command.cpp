#include <cstdio>

#include "absl/strings/str_format.h"
#include "analysis/check.h"
#include "formats/bundle_reader.h"
#include "tools/command.h"

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
  return o;
}

void Print(const analysis::Finding& f) {
  const std::string where = f.op_index >= 0 ? absl::StrFormat("op %d %s in %s (%s)", f.op_index, f.op, f.where, f.phase)
                                            : f.where;
  std::printf("  %-7s %-18s %s\n          %s\n", std::string(analysis::SeverityName(f.severity)).c_str(),
              f.check.c_str(), where.c_str(), f.message.c_str());
  if (!f.next.empty()) std::printf("          next: %s\n", f.next.c_str());
}

}  // namespace

void AddLintCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, against;
    std::vector<int64_t> steps;
    int64_t against_step = -1;
    std::vector<std::string> only;
    bool json = false, list = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "lint", "Static checks over recorded steps, no re-run: dtype headroom, hazardous op patterns, routing "
              "fragility, load imbalance, optimizer hazards, proxy preservation. Exits 1 on a warning or worse");
  cmd->add_option("BUNDLE", opts->bundle, "A bundle (any mode; optimizer-state checks need replayable or full)");
  cmd->add_option("--step", opts->steps, "Steps to check (default: every complete step)");
  cmd->add_option("--only", opts->only, "Run only this check (repeatable); --list names them");
  cmd->add_option("--against", opts->against, "The original bundle a proxy bundle is checked against");
  cmd->add_option("--against-step", opts->against_step, "Step of --against (default: its first complete step)");
  cmd->add_flag("--json", opts->json, "Print the findings as JSON");
  cmd->add_flag("--list", opts->list, "List the checks and exit");
  cmd->callback([opts, &exit_code] {
    exit_code = kExitOk;
    if (opts->list) {
      for (const auto& c : analysis::AllChecks()) {
        std::printf("%-20s %s\n", std::string(c->name()).c_str(), std::string(c->summary()).c_str());
      }
      return;
    }
    if (opts->bundle.empty()) {
      exit_code = ReportError(absl::InvalidArgumentError("lint needs a BUNDLE"));
      return;
    }
    auto reader = formats::BundleReader::Open(opts->bundle);
    if (!reader.ok()) {
      exit_code = ReportError(reader.status());
      return;
    }
    std::unique_ptr<formats::BundleReader> original;
    formats::Trace original_trace;
    analysis::StepView original_view;
    if (!opts->against.empty()) {
      auto opened = formats::BundleReader::Open(opts->against);
      if (!opened.ok()) {
        exit_code = ReportError(opened.status());
        return;
      }
      original = *std::move(opened);
      int64_t step = opts->against_step;
      if (step < 0) {
        const std::vector<int64_t> complete = original->CompleteSteps();
        if (complete.empty()) {
          exit_code = ReportError(absl::NotFoundError(opts->against + " has no complete step"));
          return;
        }
        step = complete.front();
      }
      auto trace = formats::ReadTrace(*original, step);
      if (!trace.ok()) {
        exit_code = ReportError(trace.status());
        return;
      }
      original_trace = *std::move(trace);
      original_view = analysis::StepView{original.get(), opts->against, step, &original_trace};
    }
    const absl::StatusOr<std::vector<int64_t>> to_read = StepsToRead(**reader, opts->bundle, opts->steps);
    if (!to_read.ok()) {
      exit_code = ReportError(to_read.status());
      return;
    }
    const std::vector<int64_t>& steps = *to_read;
    std::vector<analysis::Finding> all;
    std::vector<int64_t> opless;
    for (int64_t step : steps) {
      auto trace = formats::ReadTrace(**reader, step);
      if (!trace.ok()) {
        exit_code = ReportError(trace.status());
        return;
      }
      if (trace->ops.empty()) {
        // A step for model replay (moerr proxy, moerr reduce): nothing to lint.
        opless.push_back(step);
        continue;
      }
      analysis::LintInput input{analysis::StepView{reader->get(), opts->bundle, step, &*trace}, std::nullopt};
      if (original) input.original = original_view;
      auto findings = analysis::RunChecks(input, opts->only);
      if (!findings.ok()) {
        exit_code = ReportError(findings.status());
        return;
      }
      all.insert(all.end(), findings->begin(), findings->end());
    }
    if (!opless.empty()) {
      const std::string hint = absl::StrFormat(
          "%s: step %d records no ops (a step to replay, as moerr proxy and moerr reduce write); `moerr replay %s "
          "--step %d --model --out R.moerr` records one to lint",
          opts->bundle, opless.front(), opts->bundle, opless.front());
      if (opless.size() == steps.size()) {
        exit_code = ReportError(absl::FailedPreconditionError(hint));
        return;
      }
      std::fprintf(stderr, "moerr: note: %s\n", hint.c_str());
    }
    int counts[3] = {0, 0, 0};
    for (const analysis::Finding& f : all) ++counts[static_cast<int>(f.severity)];
    if (counts[1] + counts[2] > 0) exit_code = kExitFinding;
    if (opts->json) {
      llvm::json::Array out;
      for (const analysis::Finding& f : all) out.push_back(FindingJson(f));
      PrintJson(std::move(out));
      return;
    }
    int64_t step = -2;
    for (const analysis::Finding& f : all) {
      if (f.step != step) std::printf("step %lld:\n", static_cast<long long>(step = f.step));
      Print(f);
    }
    std::printf("%zu findings: %d error%s, %d warning%s, %d note%s\n", all.size(), counts[2], counts[2] == 1 ? "" : "s",
                counts[1], counts[1] == 1 ? "" : "s", counts[0], counts[0] == 1 ? "" : "s");
  });
}

}  // namespace moerr::tools
