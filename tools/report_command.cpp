#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "formats/world_run.h"
#include "report/step_section.h"
#include "report/verdict.h"
#include "report/world_section.h"
#include "support/html_page.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/run_directory.h"

namespace moerr::tools {

namespace {

// A run directory: one section per step across the ranks (report/world_section.h).
ExitOr ReportRun(const std::string& dir, std::vector<int64_t> steps, const std::string& out) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(dir));
  MOERR_ASSIGN_OR_RETURN(steps, world::RunSteps(world, steps));
  HtmlPage page("moerr report: " + dir);
  for (int64_t step : steps) {
    MOERR_RETURN_IF_ERROR(formats::ReadWorldStep(world, step));
    MOERR_RETURN_IF_ERROR(report::AddWorldSection(page, world));
  }
  MOERR_RETURN_IF_ERROR(page.Write(out));
  std::printf("wrote %s (%zu step%s of %s)\n", out.c_str(), steps.size(), steps.size() == 1 ? "" : "s", dir.c_str());
  return kExitOk;
}

}  // namespace

void AddReportCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, out;
    std::vector<int64_t> steps;
    std::vector<std::string> would_fit;
    bool force = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Write an HTML report of recorded steps: a verdict, the first overflow, per-op headroom against "
                "each output's own dtype, expert load per layer, lint findings (one file, no script)");
  cmd->add_option("BUNDLE", opts->bundle,
                  "A bundle (any mode), or a multi-rank run directory: each rank's fate, where the overflow began, a "
                  "rank x op strip of headroom, the rows each rank received, disagreeing transfers")
      ->required()
      ->transform(RecordingPath());
  cmd->add_option("-o,--output", opts->out, "The HTML file to write")->required();
  cmd->add_option("--step", opts->steps, "Steps to report (default: every complete step and every raised one)");
  cmd->add_option("--would-fit", opts->would_fit,
                  "Overlay the headroom plot with the same outputs against this format's range: would they fit if "
                  "held in it? (fp16 or bf16; repeatable)")
      ->check(CLI::IsMember({"fp16", "bf16"}));
  cmd->add_flag("--force", opts->force, "Overwrite an existing report");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    MOERR_RETURN_IF_ERROR(CheckOverwrite(opts->out, opts->force, {opts->bundle}));
    if (formats::IsRunDirectory(opts->bundle)) return ReportRun(opts->bundle, opts->steps, opts->out);
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(opts->bundle));
    MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, StepsToRead(*reader, opts->bundle, opts->steps));
    std::vector<formats::DType> would_fit;
    for (const std::string& f : opts->would_fit) {
      would_fit.push_back(f == "fp16" ? formats::DType::kF16 : formats::DType::kBF16);
    }
    HtmlPage page("moerr report: " + opts->bundle);
    std::vector<int64_t> with_ops;
    for (int64_t step : steps) {
      MOERR_ASSIGN_OR_RETURN(const formats::Trace trace, formats::ReadTrace(*reader, step));
      if (trace.ops.empty()) {
        page.Heading(absl::StrFormat("Step %d of %s", step, opts->bundle));
        page.Paragraph("No ops recorded (a step to replay, as moerr proxy and moerr reduce write): `moerr replay " +
                       opts->bundle + " --step " + std::to_string(step) + " --model --out R.moerr` records one.");
        continue;
      }
      with_ops.push_back(step);
      MOERR_RETURN_IF_ERROR(report::AddStepSection(page, *reader, opts->bundle, step, trace, would_fit));
    }
    MOERR_RETURN_IF_ERROR(report::AddMetricsSection(page, *reader));
    if (!page.has_verdict() && !with_ops.empty()) report::AddFiniteVerdict(page, opts->bundle, with_ops);
    MOERR_RETURN_IF_ERROR(page.Write(opts->out));
    std::printf("wrote %s (%zu step%s)\n", opts->out.c_str(), steps.size(), steps.size() == 1 ? "" : "s");
    return kExitOk;
  });
}

}  // namespace moerr::tools
