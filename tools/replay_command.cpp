#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "replayer/first_overflow.h"
#include "replayer/program_replay.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

std::string Describe(const formats::Fingerprint& f) {
  return absl::StrFormat("min %.6g max %.6g abs-max %.6g l2 %.6g nan %d +inf %d -inf %d hash %016x", f.min, f.max,
                         f.abs_max, f.l2, f.nan, f.pos_inf, f.neg_inf, f.hash);
}

}  // namespace

void AddReplayCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle;
    std::vector<int64_t> steps;
    bool check = false, isolated = false;
    std::string policy;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Re-execute recorded steps op by op from their leaves (or, --isolated, each op on its recorded inputs) "
      "and compare every output with the record");
  cmd->add_option("BUNDLE", opts->bundle, "A replayable or full bundle")->required();
  cmd->add_option("--step", opts->steps, "Steps to replay (default: every complete step)");
  cmd->add_flag("--check", opts->check, "Replay twice and demand bitwise equal results (determinism)");
  cmd->add_flag("--isolated", opts->isolated,
                "Run each op on its recorded inputs, so each op's error is its own (full bundles)");
  cmd->add_option("--policy", opts->policy,
                  "Precision policy file: lines \"module:PATH|tree:PATH|op:NAME fp32|fp64|round-fp16|"
                  "round-fp16-sat|round-bf16\"");
  cmd->callback([opts, &exit_code] {
    auto reader = formats::BundleReader::Open(opts->bundle);
    if (!reader.ok()) {
      exit_code = ReportError(reader.status());
      return;
    }
    replayer::ReplayOptions options;
    options.isolated = opts->isolated;
    if (!opts->policy.empty()) {
      auto policy = replayer::PrecisionPolicy::Load(opts->policy);
      if (!policy.ok()) {
        exit_code = ReportError(policy.status());
        return;
      }
      options.policy = *std::move(policy);
    }
    std::vector<int64_t> steps = opts->steps.empty() ? (*reader)->CompleteSteps() : opts->steps;
    if (steps.empty()) {
      exit_code = ReportError(absl::NotFoundError(opts->bundle + " has no complete step"));
      return;
    }
    exit_code = kExitOk;
    for (int64_t step : steps) {
      auto read = formats::ReadTrace(**reader, step);
      if (!read.ok()) {
        exit_code = ReportError(read.status());
        return;
      }
      const formats::Trace& trace = *read;
      auto report = replayer::ReplayTrace(**reader, step, trace, options);
      if (!report.ok()) {
        exit_code = ReportError(report.status());
        return;
      }
      std::printf("step %lld: %zu ops: %zu re-dispatched%s, %zu random ops from the record; %zu outputs compared, "
                  "%zu differ\n",
                  static_cast<long long>(step), report->ops, report->dispatched,
                  options.policy.empty() ? "" : absl::StrFormat(" (%d under the policy)", report->policy_ops).c_str(),
                  report->from_record, report->compared, report->mismatched);
      if (const auto& d = report->first_divergence) {
        std::printf("  first divergence: op %zu %s (%s, %s), output %llu\n    recorded %s\n    replayed %s\n",
                    d->op_index, d->op.name.c_str(), d->op.module.empty() ? "no module" : d->op.module.c_str(),
                    std::string(formats::PhaseName(d->op.phase)).c_str(), static_cast<unsigned long long>(d->output),
                    Describe(d->recorded).c_str(), Describe(d->replayed).c_str());
        exit_code = kExitFinding;
      }
      if (!options.policy.empty()) {
        // Does the policy remove (or cause) an overflow?
        const formats::Trace replayed = replayer::ReplayedTrace(trace, *report, trace.ops.size());
        const auto recorded = replayer::FindFirstOverflow(trace);
        const auto now = replayer::FindFirstOverflow(replayed);
        auto where = [](const std::optional<replayer::FirstOverflow>& f) {
          return f ? absl::StrFormat("op %d (%s, %s, %s)", f->op_index, f->op->name,
                                     f->op->module.empty() ? "no module" : f->op->module, formats::PhaseName(f->op->phase))
                   : std::string("none");
        };
        std::printf("  first overflow: recorded %s; under the policy %s\n", where(recorded).c_str(), where(now).c_str());
      }
      if (!report->errors.empty()) {
        // Isolated: each op's own error against its recorded output, worst first.
        std::vector<replayer::OutputError> worst = report->errors;
        std::sort(worst.begin(), worst.end(),
                  [](const auto& x, const auto& y) { return x.metrics.rel_l2 > y.metrics.rel_l2; });
        std::printf("  ops whose own error is largest (relative L2 against the recorded output):\n");
        for (size_t i = 0; i < std::min<size_t>(worst.size(), 10); ++i) {
          const replayer::OutputError& e = worst[i];
          const formats::OpEvent& op = trace.ops[e.op_index];
          std::printf("    op %6zu %-24s %-40s rel-L2 %.3g  max-abs %.3g  max-ULP %llu\n", e.op_index, op.name.c_str(),
                      op.module.empty() ? "(no module)" : op.module.c_str(), e.metrics.rel_l2, e.metrics.max_abs,
                      static_cast<unsigned long long>(e.metrics.max_ulp));
        }
      }
      if (opts->check) {
        auto again = replayer::ReplayTrace(**reader, step, trace, options);
        if (!again.ok()) {
          exit_code = ReportError(again.status());
          return;
        }
        const bool same = again->outputs == report->outputs;  // bitwise (Fingerprint::operator==)
        std::printf("  --check: a second replay is %s\n", same ? "bitwise identical" : "DIFFERENT");
        if (!same) exit_code = kExitFinding;
      }
    }
  });
}

}  // namespace moerr::tools
