#include "formats/ring_salvage.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "formats/bundle_copy.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_writer.h"
#include "formats/world_manifest.h"
#include "support/status.h"

namespace moerr::formats {

std::string RingDirectory(const std::string& bundle_path) { return bundle_path + ".ring"; }

std::string RingSlotPath(const std::string& dir, int64_t step) { return absl::StrFormat("%s/step%d.moerr", dir, step); }

std::vector<RingSlotFile> RingSlots(const std::string& path) {
  const std::string dir = RingDirectory(std::string(absl::StripSuffix(path, kPartialSuffix)));
  std::vector<RingSlotFile> slots;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    absl::string_view name = file;
    const bool partial = absl::ConsumeSuffix(&name, kPartialSuffix);
    int64_t step = 0;
    if (!absl::ConsumePrefix(&name, "step") || !absl::ConsumeSuffix(&name, ".moerr") || !absl::SimpleAtoi(name, &step)) {
      continue;
    }
    // A slot closed for reading back has no .partial; one written when the
    // process died has.
    auto same = std::find_if(slots.begin(), slots.end(), [&](const RingSlotFile& s) { return s.step == step; });
    if (same == slots.end()) {
      slots.push_back({step, entry.path().string()});
    } else if (!partial) {
      same->path = entry.path().string();
    }
  }
  std::sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return slots;
}

namespace {

// `in` as a readable bundle: opened as it is when finished, else salvaged
// into `scratch` first.
absl::StatusOr<std::unique_ptr<BundleReader>> Readable(const std::string& in, const std::string& scratch,
                                                       const Limits& limits, SalvageReport& report) {
  if (!absl::EndsWith(in, kPartialSuffix)) {
    if (auto opened = BundleReader::Open(in, limits); opened.ok()) {
      report.had_footer = true;
      return opened;
    }
  }
  MOERR_ASSIGN_OR_RETURN(report, Salvage(in, scratch, /*overwrite=*/true, limits));
  return BundleReader::Open(scratch, limits);
}

}  // namespace

absl::StatusOr<RingSalvageReport> SalvageWithRing(const std::string& in, const std::string& out, bool overwrite,
                                                  const Limits& limits) {
  RingSalvageReport report;
  const std::vector<RingSlotFile> slots = RingSlots(in);
  if (slots.empty()) {
    MOERR_ASSIGN_OR_RETURN(report.bundle, Salvage(in, out, overwrite, limits));
    return report;
  }
  const std::string scratch = out + ".salvaging";
  std::error_code ec;
  std::filesystem::create_directories(scratch, ec);
  if (ec) return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", scratch, ec.message()));
  auto result = [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(auto writer, BundleWriter::Create(out, WriterOptions().set_overwrite(overwrite)));
    MOERR_ASSIGN_OR_RETURN(const auto bundle, Readable(in, scratch + "/bundle.moerr", limits, report.bundle));
    MOERR_RETURN_IF_ERROR(CopyBundle(*bundle, *writer));
    for (const RingSlotFile& slot : slots) {
      RingSalvageReport::Slot& r = report.slots.emplace_back();
      r.step = slot.step;
      const std::string tmp = RingSlotPath(scratch, slot.step);
      absl::StatusOr<std::unique_ptr<BundleReader>> reader = Readable(slot.path, tmp, limits, r.report);
      if (!reader.ok()) return Annotate(reader.status(), slot.path);
      MOERR_RETURN_IF_ERROR(Annotate(CopyBundle(**reader, *writer), slot.path));
    }
    return writer->Close();
  }();
  std::filesystem::remove_all(scratch, ec);
  if (!result.ok()) return result;
  return report;
}

}  // namespace moerr::formats
