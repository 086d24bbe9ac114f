#include "formats/salvage.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "formats/file_sink.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/status.h"

namespace moerr::formats {

ScanResult ScanFrames(absl::Span<const std::byte> data) {
  ScanResult scan;
  uint64_t pos = kSuperblockSize;
  scan.end = std::min<uint64_t>(pos, data.size());
  while (pos < data.size()) {
    const uint64_t left = data.size() - pos;
    if (left < kFrameHeaderSize) {
      scan.stop = absl::DataLossError(
          absl::StrFormat("frame at offset %d: header cut after %d of %d bytes", pos, left, kFrameHeaderSize));
      break;
    }
    const FrameHeader h = DecodeFrameHeader(data.subspan(pos));
    if (h.kind < static_cast<uint32_t>(FrameKind::kChunk) || h.kind > static_cast<uint32_t>(FrameKind::kIndex)) {
      scan.stop = absl::DataLossError(absl::StrFormat("frame at offset %d: unknown kind %d", pos, h.kind));
      break;
    }
    if (h.length > left - kFrameHeaderSize || PaddedLength(h.length) > left - kFrameHeaderSize) {
      scan.stop = absl::DataLossError(absl::StrFormat(
          "%s frame at offset %d: %d payload bytes declared, %d present (cut)", FrameKindName(h.kind), pos,
          h.length, left - kFrameHeaderSize));
      break;
    }
    if (FrameHash(h.kind, h.flags, data.subspan(pos + kFrameHeaderSize, h.length)) != h.hash) {
      scan.stop =
          absl::DataLossError(absl::StrFormat("%s frame at offset %d: checksum mismatch", FrameKindName(h.kind), pos));
      break;
    }
    scan.frames.push_back(ScannedFrame{pos, h});
    pos += kFrameHeaderSize + PaddedLength(h.length);
    scan.end = pos;
  }
  return scan;
}

namespace {

// Keeps the bytes before `end`; the rest of `file` is dropped.
void KeepUpTo(uint64_t end, uint64_t file_size, ScanResult& scan, SalvageReport& report) {
  scan.end = end;
  report.bytes_kept = end;
  report.bytes_dropped = file_size - end;
}

// The intact frames of `file` (its footer, when it has one that decodes,
// left out), without a final index frame: the rebuilt index replaces it.
ScanResult ScanIntactFrames(absl::Span<const std::byte> file, SalvageReport& report) {
  absl::Span<const std::byte> data = file;
  if (file.size() >= kSuperblockSize + kFooterSize && DecodeFooter(file.subspan(file.size() - kFooterSize)).ok()) {
    report.had_footer = true;
    data = file.subspan(0, file.size() - kFooterSize);
  }
  ScanResult scan = ScanFrames(data);
  if (!scan.frames.empty() && scan.frames.back().header.kind == static_cast<uint32_t>(FrameKind::kIndex)) {
    scan.end = scan.frames.back().offset;
    scan.frames.pop_back();
  }
  report.frames = scan.frames.size();
  KeepUpTo(scan.end, file.size(), scan, report);
  if (!scan.stop.ok()) report.stop_reason = std::string(scan.stop.message());
  return scan;
}

// Loads into `index` the last checkpoint that decodes and validates, and
// returns the number of the frame after it (0 without one).
size_t FromLastCheckpoint(absl::Span<const std::byte> file, const ScanResult& scan, const Limits& limits,
                          IndexData& index, SalvageReport& report) {
  for (size_t i = scan.frames.size(); i-- > 0;) {
    const ScannedFrame& f = scan.frames[i];
    if (f.header.kind != static_cast<uint32_t>(FrameKind::kCheckpoint)) continue;
    auto decoded = DecodeIndex(file.subspan(f.offset + kFrameHeaderSize, f.header.length),
                               f.offset + kFrameHeaderSize, limits);
    if (decoded.ok() && ValidateIndex(*decoded, f.offset, limits).ok()) {
      index = *std::move(decoded);
      report.from_checkpoint = true;
      return i + 1;
    }
  }
  return 0;
}

// Adds to `index` the record frames from frame `first` on. A record that
// checksums but does not decode was written by a broken or newer writer:
// everything before it is kept, it and what follows dropped.
void AddRecords(absl::Span<const std::byte> file, size_t first, const Limits& limits, ScanResult& scan,
                IndexData& index, SalvageReport& report) {
  for (size_t i = first; i < scan.frames.size(); ++i) {
    const ScannedFrame& f = scan.frames[i];
    if (f.header.kind != static_cast<uint32_t>(FrameKind::kRecord)) continue;
    const uint64_t at = f.offset + kFrameHeaderSize;
    auto record = DecodeRecordFrame(file.subspan(at, f.header.length), f.header.flags, at, limits);
    if (!record.ok()) {
      report.stop_reason = std::string(record.status().message());
      KeepUpTo(f.offset, file.size(), scan, report);
      return;
    }
    if (f.header.flags & kRecordZstd) index.required_features |= kFeatureZstdRecords;
    switch (static_cast<RecordKind>(record->kind)) {
      case RecordKind::kBlob: index.blobs.push_back(std::move(record->blob)); break;
      case RecordKind::kTensor:
        if (record->tensor.blob < index.blobs.size()) index.tensors.push_back(std::move(record->tensor));
        break;
      default: index.records.push_back(RecordRef{record->kind, record->step, at, f.header.length});
    }
  }
}

// The report's counts: chunk frames kept that no blob of `index` refers to,
// the index's tensors, blobs and records, and its complete and incomplete
// steps (a step-begin record without a step-end), each sorted.
void CountSalvaged(const IndexData& index, const ScanResult& scan, SalvageReport& report) {
  absl::flat_hash_set<uint64_t> referenced;
  for (const BlobInfo& b : index.blobs) {
    for (const ChunkInfo& c : b.chunks) referenced.insert(c.offset);
  }
  for (const ScannedFrame& f : scan.frames) {
    if (f.offset >= scan.end) break;
    if (f.header.kind == static_cast<uint32_t>(FrameKind::kChunk) && !referenced.contains(f.offset + kFrameHeaderSize)) {
      ++report.orphan_chunks;
      report.orphan_bytes += f.header.length;
    }
  }
  report.tensors = index.tensors.size();
  report.blobs = index.blobs.size();
  report.records = index.records.size();
  absl::flat_hash_set<int64_t> begun;
  for (const RecordRef& r : index.records) {
    if (r.kind == static_cast<uint16_t>(RecordKind::kStepBegin)) begun.insert(r.step);
    if (r.kind == static_cast<uint16_t>(RecordKind::kStepEnd)) report.complete_steps.push_back(r.step);
  }
  for (int64_t s : report.complete_steps) begun.erase(s);
  report.incomplete_steps.assign(begun.begin(), begun.end());
  std::sort(report.complete_steps.begin(), report.complete_steps.end());
  std::sort(report.incomplete_steps.begin(), report.incomplete_steps.end());
}

}  // namespace

absl::StatusOr<SalvageResult> AnalyzeForSalvage(absl::Span<const std::byte> file, const Limits& limits) {
  MOERR_ASSIGN_OR_RETURN(const Superblock super, DecodeSuperblock(file));
  if (super.major > kMajorVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("superblock: format version %d is newer than this salvager's %d", super.major, kMajorVersion));
  }
  SalvageResult result;
  ScanResult scan = ScanIntactFrames(file, result.report);
  const size_t first = FromLastCheckpoint(file, scan, limits, result.index, result.report);
  AddRecords(file, first, limits, scan, result.index, result.report);
  result.data_end = scan.end;
  MOERR_RETURN_IF_ERROR(Annotate(ValidateIndex(result.index, scan.end, limits), "rebuilt index"));
  CountSalvaged(result.index, scan, result.report);
  return result;
}

absl::StatusOr<SalvageReport> Salvage(const std::string& in, const std::string& out, bool overwrite,
                                      const Limits& limits) {
  auto buffer = llvm::MemoryBuffer::getFile(in, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer) return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", in, buffer.getError().message()));
  const absl::Span<const std::byte> file(reinterpret_cast<const std::byte*>((*buffer)->getBufferStart()),
                                         (*buffer)->getBufferSize());
  auto result = AnalyzeForSalvage(file, limits);
  if (!result.ok()) return Annotate(result.status(), in);
  MOERR_ASSIGN_OR_RETURN(auto sink, FileSink::Create(out, overwrite));
  MOERR_RETURN_IF_ERROR(sink->Write(file.subspan(0, result->data_end)));
  MOERR_RETURN_IF_ERROR(sink->Commit(EncodeIndex(result->index), /*sync=*/true));
  return result->report;
}

}  // namespace moerr::formats
