#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "report/html_report.h"
#include "report/step_section.h"
#include "report/verdict.h"
#include "tools/command.h"

namespace moerr::tools {

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
  cmd->add_option("BUNDLE", opts->bundle, "A bundle (any mode)")->required();
  cmd->add_option("-o,--output", opts->out, "The HTML file to write")->required();
  cmd->add_option("--step", opts->steps, "Steps to report (default: every complete step)");
  cmd->add_option("--would-fit", opts->would_fit,
                  "Overlay the headroom plot with the same outputs against this format's range: would they fit if "
                  "held in it? (fp16 or bf16; repeatable)")
      ->check(CLI::IsMember({"fp16", "bf16"}));
  cmd->add_flag("--force", opts->force, "Overwrite an existing report");
  cmd->callback([opts, &exit_code] {
    if (absl::Status s = CheckOverwrite(opts->out, opts->force, {opts->bundle}); !s.ok()) {
      exit_code = ReportError(s);
      return;
    }
    auto reader = formats::BundleReader::Open(opts->bundle);
    if (!reader.ok()) {
      exit_code = ReportError(reader.status());
      return;
    }
    const absl::StatusOr<std::vector<int64_t>> to_read = StepsToRead(**reader, opts->bundle, opts->steps);
    if (!to_read.ok()) {
      exit_code = ReportError(to_read.status());
      return;
    }
    const std::vector<int64_t>& steps = *to_read;
    std::vector<formats::DType> would_fit;
    for (const std::string& f : opts->would_fit) {
      would_fit.push_back(f == "fp16" ? formats::DType::kF16 : formats::DType::kBF16);
    }
    report::HtmlReport page("moerr report: " + opts->bundle);
    std::vector<int64_t> with_ops;
    for (int64_t step : steps) {
      auto trace = formats::ReadTrace(**reader, step);
      if (!trace.ok()) {
        exit_code = ReportError(trace.status());
        return;
      }
      if (trace->ops.empty()) {
        page.Heading(absl::StrFormat("Step %d of %s", step, opts->bundle));
        page.Paragraph("No ops recorded (a step to replay, as moerr proxy and moerr reduce write): `moerr replay " +
                       opts->bundle + " --step " + std::to_string(step) + " --model --out R.moerr` records one.");
        continue;
      }
      with_ops.push_back(step);
      if (absl::Status s = report::AddStepSection(page, **reader, opts->bundle, step, *trace, would_fit); !s.ok()) {
        exit_code = ReportError(s);
        return;
      }
    }
    if (!page.has_verdict() && !with_ops.empty()) report::AddFiniteVerdict(page, opts->bundle, with_ops);
    if (absl::Status s = page.Write(opts->out); !s.ok()) {
      exit_code = ReportError(s);
      return;
    }
    std::printf("wrote %s (%zu step%s)\n", opts->out.c_str(), steps.size(), steps.size() == 1 ? "" : "s");
    exit_code = kExitOk;
  });
}

}  // namespace moerr::tools
