#include <cstdio>

#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "tools/command.h"

namespace moerr::tools {

void AddVerifyCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check a bundle's integrity: every frame checksum and every tensor's content hash");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file (.moerr)")->required();
  cmd->add_flag("--json", opts->json, "Print the result as JSON");
  OnRun(cmd, exit_code, [opts]() -> CommandResult {
    auto reader = formats::BundleReader::Open(opts->bundle);
    // A bundle whose bytes are damaged (kDataLoss: a checksum, a cut file, a
    // bad index) is a finding; a missing file or one that is not a bundle
    // (empty, the wrong magic, a newer format) is bad input.
    if (!reader.ok() && reader.status().code() != absl::StatusCode::kDataLoss) return reader.status();
    absl::StatusOr<formats::VerifyReport> report =
        reader.ok() ? (*reader)->Verify() : absl::StatusOr<formats::VerifyReport>(reader.status());
    const int code = report.ok() ? kExitOk : kExitFinding;
    if (opts->json) {
      llvm::json::Object out{{"bundle", opts->bundle}, {"ok", report.ok()}};
      if (report.ok()) {
        out["frames"] = static_cast<int64_t>(report->frames);
        out["tensors"] = static_cast<int64_t>(report->blobs);
        out["bytes"] = static_cast<int64_t>(report->raw_bytes);
      } else {
        out["damage"] = std::string(report.status().message());
      }
      PrintJson(std::move(out));
      return code;
    }
    if (!report.ok()) {
      std::fprintf(stderr, "moerr: %s is damaged: %s\n", opts->bundle.c_str(),
                   std::string(report.status().message()).c_str());
      std::fprintf(stderr, "  `moerr salvage %s -o FIXED.moerr` keeps every complete frame before the damage.\n",
                   opts->bundle.c_str());
      return code;
    }
    std::printf("%s: ok: %llu frames, %llu tensors' content verified (%s)\n", opts->bundle.c_str(),
                static_cast<unsigned long long>(report->frames), static_cast<unsigned long long>(report->blobs),
                formats::HumanBytes(report->raw_bytes).c_str());
    return code;
  });
}

}  // namespace moerr::tools
