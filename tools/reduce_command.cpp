#include <cstdio>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "formats/bundle_reader.h"
#include "proxy/reduce.h"
#include "support/progress.h"
#include "tools/command.h"

namespace moerr::tools {

void AddReduceCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle, out;
    int64_t step = -1;
    bool force = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "reduce", "Shrink a failing step (fewer experts, layers, prompts) while model replay still shows its first "
                "overflow in the same phase and module class; writes the smallest bundle that still fails");
  cmd->add_option("BUNDLE", opts->bundle, "A replayable or full bundle of the reference trainer")->required();
  cmd->add_option("-o,--output", opts->out, "The reduced bundle to write (OUT.moerr; candidates go to OUT.work/)")
      ->required();
  cmd->add_option("--step", opts->step, "Step to reduce (default: the first that overflowed)");
  cmd->add_flag("--force", opts->force, "Overwrite an existing output bundle");
  cmd->callback([opts, &exit_code] {
    if (std::filesystem::exists(opts->out) && !opts->force) {
      exit_code = ReportError(absl::AlreadyExistsError(opts->out + " exists; pass --force to overwrite it"));
      return;
    }
    auto reader = formats::BundleReader::Open(opts->bundle);
    if (!reader.ok()) {
      exit_code = ReportError(reader.status());
      return;
    }
    proxy::ReduceOptions options;
    options.step = opts->step;
    options.out_path = opts->out;
    options.work_dir = opts->out + ".work";
    Progress bar("reduce", 0);
    auto report = proxy::Reduce(**reader, options, [&](int64_t tried, const std::string& pass) {
      bar.Update(tried, pass);
    });
    bar.Finish();
    std::error_code ignored;
    std::filesystem::remove_all(options.work_dir, ignored);
    if (!report.ok()) {
      exit_code = ReportError(report.status());
      return;
    }
    exit_code = kExitOk;
    std::printf("step %lld fails in %s (%s); %lld candidates replayed in %.1f s\n\n",
                static_cast<long long>(report->step), report->module_class.c_str(), report->phase.c_str(),
                static_cast<long long>(report->tried), report->seconds);
    std::printf("| pass | removed |\n|---|---|\n");
    for (const proxy::ReduceRow& row : report->accepted) {
      std::printf("| %s | %s |\n", row.pass.c_str(), row.removed.c_str());
    }
    std::printf("\n| | original | reduced | ratio |\n|---|---|---|---|\n");
    auto line = [](const char* what, int64_t a, int64_t b) {
      std::printf("| %s | %lld | %lld | %.2fx |\n", what, static_cast<long long>(a), static_cast<long long>(b),
                  b > 0 ? double(a) / b : 0.0);
    };
    line("policy parameters", report->params_before, report->params_after);
    line("decoder layers", report->layers_before, report->layers_after);
    line("experts per MoE layer", report->experts_before, report->experts_after);
    line("prompts per step", report->prompts_before, report->prompts_after);
    std::printf("\nwrote %s (moerr replay %s --model)\n", opts->out.c_str(), opts->out.c_str());
  });
}

}  // namespace moerr::tools
