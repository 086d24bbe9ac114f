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

absl::StatusOr<SalvageResult> AnalyzeForSalvage(absl::Span<const std::byte> file, const Limits& limits) {
  MOERR_ASSIGN_OR_RETURN(const Superblock super, DecodeSuperblock(file));
  if (super.major > kMajorVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("superblock: format version %d is newer than this salvager's %d", super.major, kMajorVersion));
  }
  SalvageResult result;
  SalvageReport& report = result.report;
  absl::Span<const std::byte> data = file;
  if (file.size() >= kSuperblockSize + kFooterSize && DecodeFooter(file.subspan(file.size() - kFooterSize)).ok()) {
    report.had_footer = true;
    data = file.subspan(0, file.size() - kFooterSize);
  }
  ScanResult scan = ScanFrames(data);
  // The final index frame is not data: the rebuilt index replaces it.
  if (!scan.frames.empty() && scan.frames.back().header.kind == static_cast<uint32_t>(FrameKind::kIndex)) {
    scan.end = scan.frames.back().offset;
    scan.frames.pop_back();
  }
  report.frames = scan.frames.size();
  report.bytes_kept = scan.end;
  report.bytes_dropped = file.size() - scan.end;
  if (!scan.stop.ok()) report.stop_reason = std::string(scan.stop.message());

  // Start from the last checkpoint that decodes and validates.
  IndexData& index = result.index;
  size_t first = 0;
  for (size_t i = scan.frames.size(); i-- > 0;) {
    const ScannedFrame& f = scan.frames[i];
    if (f.header.kind != static_cast<uint32_t>(FrameKind::kCheckpoint)) continue;
    auto decoded = DecodeIndex(file.subspan(f.offset + kFrameHeaderSize, f.header.length),
                               f.offset + kFrameHeaderSize, limits);
    if (decoded.ok() && ValidateIndex(*decoded, f.offset, limits).ok()) {
      index = *std::move(decoded);
      first = i + 1;
      report.from_checkpoint = true;
      break;
    }
  }
  for (size_t i = first; i < scan.frames.size(); ++i) {
    const ScannedFrame& f = scan.frames[i];
    if (f.header.kind != static_cast<uint32_t>(FrameKind::kRecord)) continue;
    const uint64_t at = f.offset + kFrameHeaderSize;
    auto record = DecodeRecordFrame(file.subspan(at, f.header.length), f.header.flags, at, limits);
    if (!record.ok()) {
      // A record that checksums but does not decode was written by a broken or
      // newer writer; keep everything before it.
      report.stop_reason = std::string(record.status().message());
      scan.end = f.offset;
      report.bytes_kept = scan.end;
      report.bytes_dropped = file.size() - scan.end;
      break;
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
  result.data_end = scan.end;
  MOERR_RETURN_IF_ERROR(Annotate(ValidateIndex(index, scan.end, limits), "rebuilt index"));

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
