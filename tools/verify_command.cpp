#include <algorithm>
#include <cstdio>

#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/run_directory.h"

namespace moerr::tools {
namespace {

// Verifies one bundle; prints the result or adds it to `json`.
ExitOr VerifyBundle(const world::RankBundle& b, llvm::json::Array* json) {
  auto reader = formats::BundleReader::Open(b.path);
  // A bundle whose bytes are damaged (kDataLoss: a checksum, a cut file, a
  // bad index) is a finding; a missing file or one that is not a bundle
  // (empty, the wrong magic, a newer format) is bad input.
  // A rank of a run whose bundle is missing is a finding too: the run is damaged.
  if (!reader.ok() && reader.status().code() != absl::StatusCode::kDataLoss &&
      !(b.rank >= 0 && reader.status().code() == absl::StatusCode::kNotFound)) {
    return reader.status();
  }
  absl::StatusOr<formats::VerifyReport> report =
      reader.ok() ? (*reader)->Verify() : absl::StatusOr<formats::VerifyReport>(reader.status());
  const int code = report.ok() ? kExitOk : kExitFinding;
  if (json != nullptr) {
    llvm::json::Object out{{"bundle", b.path}, {"ok", report.ok()}};
    if (b.rank >= 0) out["rank"] = b.rank;
    if (report.ok()) {
      out["frames"] = static_cast<int64_t>(report->frames);
      out["tensors"] = static_cast<int64_t>(report->blobs);
      out["bytes"] = static_cast<int64_t>(report->raw_bytes);
    } else {
      out["damage"] = std::string(report.status().message());
    }
    json->push_back(std::move(out));
    return code;
  }
  if (!report.ok()) {
    std::fprintf(stderr, "moerr: %s%s is damaged: %s\n", world::RankPrefix(b).c_str(), b.path.c_str(),
                 std::string(report.status().message()).c_str());
    if (b.rank >= 0) {
      std::fprintf(stderr, "  `moerr salvage RUN` salvages every rank's unfinished bundle in place.\n");
    } else {
      std::fprintf(stderr, "  `moerr salvage %s -o FIXED.moerr` keeps every complete frame before the damage.\n",
                   b.path.c_str());
    }
    return code;
  }
  std::printf("%s%s: ok: %llu frames, %llu tensors' content verified (%s)\n", world::RankPrefix(b).c_str(), b.path.c_str(),
              static_cast<unsigned long long>(report->frames), static_cast<unsigned long long>(report->blobs),
              formats::HumanBytes(report->raw_bytes).c_str());
  return code;
}

}  // namespace

void AddVerifyCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string bundle;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check a bundle's integrity: every frame checksum and every tensor's content hash; for a multi-rank "
                "run directory, every rank's bundle, then that what each rank received is what the others sent");
  cmd->add_option("BUNDLE", opts->bundle, "Bundle file (.moerr), or a run directory (world.json)")->required()
      ->transform(RecordingPath());
  cmd->add_flag("--json", opts->json, "Print the result as JSON");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    MOERR_ASSIGN_OR_RETURN(const std::vector<world::RankBundle> bundles, world::BundlesOf(opts->bundle));
    llvm::json::Array results, checks;
    int code = kExitOk;
    for (const world::RankBundle& b : bundles) {
      MOERR_ASSIGN_OR_RETURN(const int one, VerifyBundle(b, opts->json ? &results : nullptr));
      code = std::max(code, one);
    }
    if (bundles.front().rank < 0) {
      if (opts->json) PrintJson(std::move(results.front()));
      return code;
    }
    MOERR_ASSIGN_OR_RETURN(const int cross, world::CheckRunCollectives(opts->bundle, {}, opts->json ? &checks : nullptr));
    if (opts->json) PrintJson(llvm::json::Object{{"ranks", std::move(results)}, {"cross_rank", std::move(checks)}});
    return std::max(code, cross);
  });
}

}  // namespace moerr::tools
