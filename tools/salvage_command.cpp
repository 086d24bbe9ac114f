#include <cstdio>

#include "absl/strings/str_join.h"
#include "formats/bundle_summary.h"
#include "formats/salvage.h"
#include "support/status.h"
#include "tools/command.h"

namespace moerr::tools {

void AddSalvageCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string in, out;
    bool force = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "salvage", "Rebuild the index of a crashed writer's bundle (or .partial file) from its complete frames");
  cmd->add_option("BUNDLE", opts->in, "Damaged or unfinished bundle")->required();
  cmd->add_option("-o,--output", opts->out, "Where to write the repaired bundle")->required();
  cmd->add_flag("--force", opts->force, "Overwrite the output if it exists");
  OnRun(cmd, exit_code, [opts]() -> CommandResult {
    MOERR_RETURN_IF_ERROR(CheckNotAnInput(opts->out, {opts->in}));
    MOERR_ASSIGN_OR_RETURN(const formats::SalvageReport r, formats::Salvage(opts->in, opts->out, opts->force));
    std::printf("%s -> %s\n", opts->in.c_str(), opts->out.c_str());
    if (r.had_footer) std::printf("  the input was a finished bundle; its index was rebuilt from the frames\n");
    std::printf("  kept %llu complete frames (%s)%s\n", static_cast<unsigned long long>(r.frames),
                formats::HumanBytes(r.bytes_kept).c_str(), r.from_checkpoint ? ", from the last checkpoint on" : "");
    std::printf("  recovered %llu tensors (%llu blobs), %llu records\n", static_cast<unsigned long long>(r.tensors),
                static_cast<unsigned long long>(r.blobs), static_cast<unsigned long long>(r.records));
    std::printf("  complete steps: %s\n", r.complete_steps.empty() ? "none" : absl::StrJoin(r.complete_steps, ", ").c_str());
    if (!r.incomplete_steps.empty()) {
      std::printf("  lost: steps %s began but did not finish\n", absl::StrJoin(r.incomplete_steps, ", ").c_str());
    }
    if (r.orphan_chunks > 0) {
      std::printf("  lost: %llu chunks (%s) of tensors whose records were cut\n",
                  static_cast<unsigned long long>(r.orphan_chunks), formats::HumanBytes(r.orphan_bytes).c_str());
    }
    if (!r.stop_reason.empty()) {
      std::printf("  lost: %s after the last complete frame: %s\n", formats::HumanBytes(r.bytes_dropped).c_str(),
                  r.stop_reason.c_str());
    }
    return kExitOk;
  });
}

}  // namespace moerr::tools
