#include "recorder/anomaly_ring.h"

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_format.h"
#include "formats/bundle_copy.h"
#include "formats/bundle_reader.h"
#include "formats/ring_salvage.h"
#include "formats/world_manifest.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::recorder {

absl::StatusOr<std::unique_ptr<AnomalyRing>> AnomalyRing::Create(const std::string& bundle_path, int64_t steps,
                                                                 bool overwrite) {
  const std::string dir = formats::RingDirectory(bundle_path);
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    if (!overwrite) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "%s exists: the anomaly ring of a recording that was killed; `moerr salvage %s%s -o OUT` recovers its "
          "steps (or overwrite to discard it)",
          dir, bundle_path, formats::kPartialSuffix));
    }
    std::filesystem::remove_all(dir, ec);
    if (ec) return absl::UnavailableError(absl::StrFormat("cannot remove %s: %s", dir, ec.message()));
  }
  if (!std::filesystem::create_directories(dir, ec) || ec) {
    return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", dir, ec.message()));
  }
  return std::unique_ptr<AnomalyRing>(new AnomalyRing(dir, steps));
}

AnomalyRing::~AnomalyRing() {
  for (Slot& slot : slots_) slot.writer.reset();  // waits for its chunks; the file stays
}

void AnomalyRing::Delete(Slot& slot) {
  slot.writer.reset();
  std::remove((slot.path + formats::kPartialSuffix).c_str());
  std::remove(slot.path.c_str());
}

absl::Status AnomalyRing::Begin(int64_t step) {
  MOERR_CHECK(!open_) << "AnomalyRing::Begin inside step " << slots_.back().step;
  Slot slot;
  slot.step = step;
  slot.path = formats::RingSlotPath(dir_, step);
  // No fsync at Close: a slot is read back at once, or deleted. Stored raw:
  // a fresh file each step deduplicates nothing against the steps before
  // (the frozen reference model's parameters, say), so encoding them would
  // be paid every step; what is kept is encoded when copied into the bundle.
  MOERR_ASSIGN_OR_RETURN(slot.writer,
                         formats::BundleWriter::Create(
                             slot.path, formats::WriterOptions().set_overwrite(true).set_sync(false).set_compress(false)));
  MOERR_RETURN_IF_ERROR(slot.writer->BeginStep(step));
  slots_.push_back(std::move(slot));
  open_ = true;
  while (static_cast<int64_t>(slots_.size()) > steps_) {
    Delete(slots_.front());
    slots_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status AnomalyRing::End(bool complete) {
  MOERR_CHECK(open_) << "AnomalyRing::End outside a step";
  open_ = false;
  Slot& slot = slots_.back();
  slot.complete = complete;
  // A raised step's slot gets no stepEnd; either way what it holds is in the file.
  return complete ? slot.writer->EndStep(slot.step) : slot.writer->Flush();
}

absl::StatusOr<std::vector<int64_t>> AnomalyRing::KeepInto(formats::BundleWriter& to) {
  std::vector<int64_t> complete;
  for (Slot& slot : slots_) {
    MOERR_RETURN_IF_ERROR(slot.writer->Close());
    slot.writer.reset();
    MOERR_ASSIGN_OR_RETURN(const auto reader, formats::BundleReader::Open(slot.path));
    MOERR_RETURN_IF_ERROR(
        Annotate(formats::CopyBundle(*reader, to), absl::StrFormat("the anomaly ring's step %d", slot.step)));
    if (slot.complete) complete.push_back(slot.step);
  }
  for (Slot& slot : slots_) Delete(slot);
  slots_.clear();
  open_ = false;
  MOERR_RETURN_IF_ERROR(to.Checkpoint());
  return complete;
}

void AnomalyRing::Discard() {
  for (Slot& slot : slots_) Delete(slot);
  slots_.clear();
  open_ = false;
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);  // best effort: a leftover empty directory is harmless
}

int AnomalyRing::crash_fd() const { return open_ ? slots_.back().writer->crash_fd() : -1; }

}  // namespace moerr::recorder
