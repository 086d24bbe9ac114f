#include "formats/bundle_reader.h"

#include "absl/strings/str_format.h"
#include "formats/chunk_codec.h"
#include "formats/salvage.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/status.h"

namespace moerr::formats {
namespace {

// The steps of the records `keep` selects, ascending, each once.
template <typename Keep>
std::vector<int64_t> StepsOf(const std::vector<RecordRef>& records, Keep keep) {
  std::vector<int64_t> steps;
  for (const RecordRef& r : records) {
    if (keep(r)) steps.push_back(r.step);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

}  // namespace

BundleReader::BundleReader(std::unique_ptr<llvm::MemoryBuffer> buffer, const Limits& limits)
    : buffer_(std::move(buffer)),
      file_(reinterpret_cast<const std::byte*>(buffer_->getBufferStart()), buffer_->getBufferSize()),
      limits_(limits) {}

BundleReader::~BundleReader() = default;

absl::StatusOr<std::unique_ptr<BundleReader>> BundleReader::Open(const std::string& path, const Limits& limits) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false,
                                            /*IsVolatile=*/false);
  if (!buffer) {
    return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", path, buffer.getError().message()));
  }
  auto reader = FromBuffer(std::move(*buffer), limits);
  if (!reader.ok()) return Annotate(reader.status(), path);
  return reader;
}

absl::StatusOr<std::unique_ptr<BundleReader>> BundleReader::FromBuffer(std::unique_ptr<llvm::MemoryBuffer> buffer,
                                                                       const Limits& limits) {
  auto reader = std::unique_ptr<BundleReader>(new BundleReader(std::move(buffer), limits));
  MOERR_RETURN_IF_ERROR(reader->Load());
  return reader;
}

absl::Status BundleReader::Load() {
  const uint64_t size = file_.size();
  if (size < kSuperblockSize + kFrameHeaderSize + kFooterSize) {
    MOERR_ASSIGN_OR_RETURN(superblock_, DecodeSuperblock(file_));  // names a wrong magic first
    return absl::DataLossError(absl::StrFormat(
        "file has %d bytes, too short for a finished bundle; `moerr salvage` recovers a cut one", size));
  }
  MOERR_ASSIGN_OR_RETURN(superblock_, DecodeSuperblock(file_));
  if (superblock_.major > kMajorVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "superblock: format version %d.%d is newer than this reader's %d.x; use a newer moerr", superblock_.major,
        superblock_.minor, kMajorVersion));
  }
  MOERR_ASSIGN_OR_RETURN(footer_, DecodeFooter(file_.subspan(size - kFooterSize)));
  const uint64_t data_end = size - kFooterSize;
  uint64_t index_end;
  if (footer_.index_offset % 8 != 0) {
    return absl::DataLossError(absl::StrFormat("footer: index offset %d is not 8-byte aligned", footer_.index_offset));
  }
  if (footer_.index_offset < kSuperblockSize + kFrameHeaderSize ||
      __builtin_add_overflow(footer_.index_offset, footer_.index_length, &index_end) || index_end > data_end) {
    return absl::DataLossError(absl::StrFormat("footer: index [%d, +%d) is outside the file's data area [%d, %d)",
                                               footer_.index_offset, footer_.index_length,
                                               kSuperblockSize + kFrameHeaderSize, data_end));
  }
  if (footer_.index_length > limits_.max_index_bytes) {
    return absl::DataLossError(absl::StrFormat("footer: index length %d exceeds the limit %d", footer_.index_length,
                                               limits_.max_index_bytes));
  }
  MOERR_ASSIGN_OR_RETURN(auto payload, Payload(footer_.index_offset, footer_.index_length, FrameKind::kIndex));
  const FrameHeader header = DecodeFrameHeader(file_.subspan(footer_.index_offset - kFrameHeaderSize));
  if (header.hash != footer_.index_hash) {
    return absl::DataLossError("footer: index hash differs from the index frame's");
  }
  MOERR_ASSIGN_OR_RETURN(index_, DecodeIndex(payload, footer_.index_offset, limits_));
  // Data frames end where the index frame's header begins.
  MOERR_RETURN_IF_ERROR(ValidateIndex(index_, footer_.index_offset - kFrameHeaderSize, limits_));
  tensor_by_name_.reserve(index_.tensors.size());
  for (uint32_t i = 0; i < index_.tensors.size(); ++i) {
    tensor_by_name_.emplace(std::make_pair(index_.tensors[i].name, index_.tensors[i].step), i);
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const std::byte>> BundleReader::Payload(uint64_t offset, uint64_t length,
                                                                  FrameKind kind, uint32_t* flags) const {
  // Callers have bounds-checked [offset, offset + length) inside the data area.
  const FrameHeader header = DecodeFrameHeader(file_.subspan(offset - kFrameHeaderSize));
  if (header.kind != static_cast<uint32_t>(kind) || header.length != length) {
    return absl::DataLossError(absl::StrFormat(
        "frame at offset %d: header says %s of %d bytes, the index says %s of %d bytes", offset - kFrameHeaderSize,
        FrameKindName(header.kind), header.length, FrameKindName(static_cast<uint32_t>(kind)), length));
  }
  const auto payload = file_.subspan(offset, length);
  if (FrameHash(header.kind, header.flags, payload) != header.hash) {
    return absl::DataLossError(absl::StrFormat("%s frame at offset %d: checksum mismatch (corrupt bytes)",
                                               FrameKindName(header.kind), offset - kFrameHeaderSize));
  }
  if (flags != nullptr) *flags = header.flags;
  return payload;
}

const TensorInfo* BundleReader::FindTensor(absl::string_view name, int64_t step) const {
  auto it = tensor_by_name_.find(std::make_pair(std::string(name), step));
  return it == tensor_by_name_.end() ? nullptr : &index_.tensors[it->second];
}

absl::StatusOr<OwnedTensor> BundleReader::ReadTensor(absl::string_view name, int64_t step) const {
  const TensorInfo* tensor = FindTensor(name, step);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrFormat("no tensor \"%s\" at step %d in the bundle", name, step));
  }
  auto out = ReadBlob(tensor->blob);
  if (!out.ok()) return Annotate(out.status(), absl::StrFormat("tensor \"%s\"", name));
  return out;
}

absl::StatusOr<OwnedTensor> BundleReader::ReadBlob(uint32_t b) const {
  if (b >= index_.blobs.size()) return absl::NotFoundError(absl::StrFormat("no blob %d", b));
  const BlobInfo& blob = index_.blobs[b];
  if (blob.raw_size > limits_.max_materialized_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat("blob %d: %d bytes exceed the read limit of %d bytes", b,
                                                        blob.raw_size, limits_.max_materialized_bytes));
  }
  OwnedTensor out;
  out.dtype = blob.dtype;
  out.shape = blob.shape;
  out.bytes.resize(blob.raw_size);  // validated: == numel * itemsize == sum of chunk sizes
  uint64_t at = 0;
  for (size_t c = 0; c < blob.chunks.size(); ++c) {
    MOERR_RETURN_IF_ERROR(DecodeBlobChunk(b, c, absl::MakeSpan(out.bytes.data() + at, blob.chunks[c].raw_size)));
    at += blob.chunks[c].raw_size;
  }
  return out;
}

absl::Status BundleReader::DecodeBlobChunk(uint32_t b, size_t c, absl::Span<std::byte> out) const {
  if (b >= index_.blobs.size() || c >= index_.blobs[b].chunks.size()) {
    return absl::NotFoundError(absl::StrFormat("no chunk %d of blob %d", c, b));
  }
  const ChunkInfo& chunk = index_.blobs[b].chunks[c];
  if (out.size() != chunk.raw_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("blob %d: chunk %d holds %d bytes, not %d", b, c, chunk.raw_size, out.size()));
  }
  MOERR_ASSIGN_OR_RETURN(auto payload, Payload(chunk.offset, chunk.stored_size, FrameKind::kChunk));
  absl::Status s = DecodeChunk(payload, chunk.codec, chunk.shuffle, out);
  if (!s.ok()) return Annotate(s, absl::StrFormat("blob %d: chunk %d at offset %d", b, c, chunk.offset));
  return absl::OkStatus();
}

absl::StatusOr<Record> BundleReader::ReadRecord(const RecordRef& ref) const {
  uint32_t flags = 0;
  MOERR_ASSIGN_OR_RETURN(auto payload, Payload(ref.offset, ref.length, FrameKind::kRecord, &flags));
  return DecodeRecordFrame(payload, flags, ref.offset, limits_);
}

absl::StatusOr<llvm::json::Value> BundleReader::ReadAnnotation(absl::string_view key, int64_t step) const {
  std::optional<llvm::json::Value> found;
  for (const RecordRef& ref : index_.records) {
    if (ref.kind != static_cast<uint16_t>(RecordKind::kAnnotation) || ref.step != step) continue;
    MOERR_ASSIGN_OR_RETURN(Record record, ReadRecord(ref));
    if (record.key == key) found = std::move(record.value);
  }
  if (!found) {
    return absl::NotFoundError(step < 0 ? absl::StrFormat("no annotation \"%s\"", key)
                                        : absl::StrFormat("no annotation \"%s\" at step %d", key, step));
  }
  return *std::move(found);
}

std::vector<int64_t> BundleReader::CompleteSteps() const {
  return StepsOf(index_.records,
                 [](const RecordRef& r) { return r.kind == static_cast<uint16_t>(RecordKind::kStepEnd); });
}

std::vector<int64_t> BundleReader::Steps() const {
  return StepsOf(index_.records, [](const RecordRef& r) { return r.step >= 0; });
}

absl::StatusOr<VerifyReport> BundleReader::Verify() const {
  VerifyReport report;
  const ScanResult scan = ScanFrames(file_.subspan(0, file_.size() - kFooterSize));
  if (!scan.stop.ok()) return scan.stop;
  report.frames = scan.frames.size();
  for (uint32_t b = 0; b < index_.blobs.size(); ++b) {
    MOERR_ASSIGN_OR_RETURN(OwnedTensor t, ReadBlob(b));
    const BlobInfo& blob = index_.blobs[b];
    if (!(ComputeBlobHash(t.dtype, t.shape, t.bytes) == blob.hash)) {
      return absl::DataLossError(
          absl::StrFormat("blob %d: content hash mismatch: its bytes decode but are not what was written", b));
    }
    ++report.blobs;
    report.raw_bytes += blob.raw_size;
  }
  return report;
}

}  // namespace moerr::formats
