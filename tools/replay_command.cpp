#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
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
    bool check = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Re-execute recorded steps op by op from their leaves and compare every output with the record");
  cmd->add_option("BUNDLE", opts->bundle, "A replayable or full bundle")->required();
  cmd->add_option("--step", opts->steps, "Steps to replay (default: every complete step)");
  cmd->add_flag("--check", opts->check, "Replay twice and demand bitwise equal results (determinism)");
  cmd->callback([opts, &exit_code] {
    auto reader = formats::BundleReader::Open(opts->bundle);
    if (!reader.ok()) {
      exit_code = ReportError(reader.status());
      return;
    }
    std::vector<int64_t> steps = opts->steps.empty() ? (*reader)->CompleteSteps() : opts->steps;
    if (steps.empty()) {
      exit_code = ReportError(absl::NotFoundError(opts->bundle + " has no complete step"));
      return;
    }
    exit_code = kExitOk;
    for (int64_t step : steps) {
      auto report = replayer::ReplayStep(**reader, step);
      if (!report.ok()) {
        exit_code = ReportError(report.status());
        return;
      }
      std::printf("step %lld: %zu ops: %zu re-dispatched, %zu random ops from the record; %zu outputs compared, "
                  "%zu differ\n",
                  static_cast<long long>(step), report->ops, report->dispatched, report->from_record, report->compared,
                  report->mismatched);
      if (const auto& d = report->first_divergence) {
        std::printf("  first divergence: op %zu %s (%s, %s), output %llu\n    recorded %s\n    replayed %s\n",
                    d->op_index, d->op.name.c_str(), d->op.module.empty() ? "no module" : d->op.module.c_str(),
                    std::string(formats::PhaseName(d->op.phase)).c_str(), static_cast<unsigned long long>(d->output),
                    Describe(d->recorded).c_str(), Describe(d->replayed).c_str());
        exit_code = kExitFinding;
      }
      if (opts->check) {
        auto again = replayer::ReplayStep(**reader, step);
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
