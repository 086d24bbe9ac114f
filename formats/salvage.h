// Salvage: rebuild the index of a bundle whose writer died. Frames are
// self-delimiting and checksummed, so a scan from the superblock finds every
// complete frame; it stops at the first cut or corrupt one. The last
// checkpoint frame (a partial index) before the stop saves decoding the
// records it covers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/bundle_index.h"
#include "formats/frame.h"
#include "formats/limits.h"

namespace moerr::formats {

struct ScannedFrame {
  uint64_t offset = 0;  // of the header
  FrameHeader header;
};

struct ScanResult {
  std::vector<ScannedFrame> frames;  // every complete, checksummed frame
  uint64_t end = 0;                  // end of the last complete frame
  absl::Status stop;                 // ok when the scan reached the end cleanly
};

// Scans `data` (a file, or its prefix before the footer) from the end of the
// superblock.
ScanResult ScanFrames(absl::Span<const std::byte> data);

struct SalvageReport {
  bool had_footer = false;       // the file was finished; nothing was lost
  uint64_t frames = 0;           // complete frames kept
  uint64_t bytes_kept = 0;
  uint64_t bytes_dropped = 0;    // after the last complete frame
  std::string stop_reason;       // why the scan stopped early ("" if it did not)
  uint64_t tensors = 0;          // recovered
  uint64_t blobs = 0;
  uint64_t records = 0;          // other than blob and tensor records
  uint64_t orphan_chunks = 0;    // chunk frames of a tensor whose records were cut
  uint64_t orphan_bytes = 0;
  std::vector<int64_t> complete_steps;    // stepEnd recovered
  std::vector<int64_t> incomplete_steps;  // stepBegin without stepEnd
  bool from_checkpoint = false;
};

struct SalvageResult {
  IndexData index;
  SalvageReport report;
  uint64_t data_end = 0;  // bytes of the input that the index describes
};

// Rebuilds the index of `file` in memory.
absl::StatusOr<SalvageResult> AnalyzeForSalvage(absl::Span<const std::byte> file, const Limits& limits = {});

// Writes OUT: the complete frames of IN, then the rebuilt index and a footer.
absl::StatusOr<SalvageReport> Salvage(const std::string& in, const std::string& out, bool overwrite,
                                      const Limits& limits = {});

}  // namespace moerr::formats
