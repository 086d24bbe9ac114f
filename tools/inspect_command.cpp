#include <cstdio>

#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {

void AddInspectCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("inspect", "What a bundle holds: tensors by role, sizes, records, steps");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file (.moerr)")->required();
  cmd->add_flag("--json", opts->json, "Print JSON instead of a table");
  OnRun(cmd, exit_code, [opts]() -> CommandResult {
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(opts->bundle));
    MOERR_ASSIGN_OR_RETURN(const formats::BundleSummary summary, formats::Summarize(*reader));
    if (opts->json) {
      PrintJson(formats::ToJson(summary));
    } else {
      std::printf("%s", formats::RenderText(summary, opts->bundle).c_str());
    }
    return kExitOk;
  });
}

}  // namespace moerr::tools
