#include <cstdio>

#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "tools/command.h"

namespace moerr::tools {

void AddVerifyCommand(CLI::App& app, int& exit_code) {
  auto bundle = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check a bundle's integrity: every frame checksum and every tensor's content hash");
  cmd->add_option("BUNDLE", *bundle, "Bundle file (.moerr)")->required();
  cmd->callback([bundle, &exit_code] {
    auto reader = formats::BundleReader::Open(*bundle);
    absl::StatusOr<formats::VerifyReport> report =
        reader.ok() ? (*reader)->Verify() : absl::StatusOr<formats::VerifyReport>(reader.status());
    if (!report.ok()) {
      std::fprintf(stderr, "moerr: %s is damaged: %s\n", bundle->c_str(), std::string(report.status().message()).c_str());
      std::fprintf(stderr, "  `moerr salvage %s -o FIXED.moerr` keeps every complete frame before the damage.\n",
                   bundle->c_str());
      exit_code = kExitFinding;
      return;
    }
    std::printf("%s: ok: %llu frames, %llu tensors' content verified (%s)\n", bundle->c_str(),
                static_cast<unsigned long long>(report->frames), static_cast<unsigned long long>(report->blobs),
                formats::HumanBytes(report->raw_bytes).c_str());
    exit_code = kExitOk;
  });
}

}  // namespace moerr::tools
