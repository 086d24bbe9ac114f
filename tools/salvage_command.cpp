#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"

#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "formats/bundle_summary.h"
#include "formats/ring_salvage.h"
#include "formats/salvage.h"
#include "formats/world_manifest.h"
#include "support/status.h"
#include "tools/command.h"
#include "world/run_directory.h"

namespace moerr::tools {

namespace {

void PrintReport(const std::string& in, const std::string& out, const formats::SalvageReport& r) {
  std::printf("%s -> %s\n", in.c_str(), out.c_str());
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
}

// The recording's own report, then each slot of its anomaly ring.
void PrintReport(const std::string& in, const std::string& out, const formats::RingSalvageReport& r) {
  PrintReport(in, out, r.bundle);
  if (r.slots.empty()) return;
  const std::string ring = formats::RingDirectory(std::string(absl::StripSuffix(in, formats::kPartialSuffix)));
  std::printf("  the anomaly ring (%s): %zu step%s\n", ring.c_str(), r.slots.size(), r.slots.size() == 1 ? "" : "s");
  for (const formats::RingSalvageReport::Slot& s : r.slots) {
    const bool complete = !s.report.complete_steps.empty();
    std::printf("    step %lld: %s, %llu records, %llu tensors%s\n", static_cast<long long>(s.step),
                complete ? "complete" : "cut off inside the step", static_cast<unsigned long long>(s.report.records),
                static_cast<unsigned long long>(s.report.tensors),
                s.report.bytes_dropped > 0
                    ? (", lost " + formats::HumanBytes(s.report.bytes_dropped) + " after its last complete frame").c_str()
                    : "");
  }
}

// A run directory: each rank whose writer did not finish (rankK.moerr.partial
// alone) is salvaged into rankK.moerr beside it; the .partial stays.
ExitOr SalvageRun(const std::string& dir) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<world::RankBundle> bundles, world::BundlesOf(dir));
  int salvaged = 0;
  absl::Status failed;  // the first rank that could not be salvaged
  for (const world::RankBundle& b : bundles) {
    if (!b.partial) continue;
    // The writer of `out` would write out.partial, which is the input: it
    // writes a temporary name, renamed once it is finished.
    const std::string out = b.path.substr(0, b.path.size() - std::strlen(formats::kPartialSuffix));
    const std::string tmp = out + ".salvaging";
    absl::StatusOr<formats::RingSalvageReport> r = formats::SalvageWithRing(b.path, tmp, /*overwrite=*/true);
    if (r.ok() && std::rename(tmp.c_str(), out.c_str()) != 0) {
      r = absl::UnavailableError(absl::StrFormat("cannot rename %s to %s", tmp, out));
    }
    if (!r.ok()) {  // the other ranks are still salvaged
      std::remove(tmp.c_str());
      std::fprintf(stderr, "moerr: error: %s%s\n", world::RankPrefix(b).c_str(), std::string(r.status().message()).c_str());
      failed = failed.ok() ? r.status() : failed;
      continue;
    }
    std::printf("%s", world::RankPrefix(b).c_str());
    PrintReport(b.path, out, *r);
    ++salvaged;
  }
  if (!failed.ok()) return failed;
  if (salvaged == 0) std::printf("%s: every rank's bundle is finished; nothing to salvage\n", dir.c_str());
  return kExitOk;
}

}  // namespace

void AddSalvageCommand(CLI::App& app, int& exit_code) {
  struct Options {
    std::string in, out;
    bool force = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "salvage", "Rebuild the index of a crashed writer's bundle (or .partial file) from its complete frames; in a "
                 "multi-rank run directory, every rank's unfinished bundle, in place");
  cmd->add_option("BUNDLE", opts->in, "Damaged or unfinished bundle, or a run directory (world.json)")->required()
      ->transform(RecordingPath());
  cmd->add_option("-o,--output", opts->out, "Where to write the repaired bundle (a bundle, not a run directory)");
  cmd->add_flag("--force", opts->force, "Overwrite the output if it exists");
  OnRun(cmd, exit_code, [opts]() -> ExitOr {
    if (formats::IsRunDirectory(opts->in)) {
      if (!opts->out.empty()) {
        return absl::InvalidArgumentError("-o names a bundle: a run directory is salvaged in place (rankK.moerr)");
      }
      return SalvageRun(opts->in);
    }
    if (opts->out.empty()) return absl::InvalidArgumentError("-o OUTPUT is required for a bundle");
    MOERR_RETURN_IF_ERROR(CheckNotAnInput(opts->out, {opts->in}));
    MOERR_ASSIGN_OR_RETURN(const formats::RingSalvageReport r,
                           formats::SalvageWithRing(opts->in, opts->out, opts->force));
    PrintReport(opts->in, opts->out, r);
    return kExitOk;
  });
}

}  // namespace moerr::tools
