// The checks of a decoded index against the file it came from and the
// reader's limits (bundle_index.h): what a reader must know before it trusts
// an offset, a size or a name.
#include "formats/bundle_index.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/frame.h"
#include "formats/tensor_view.h"
#include "support/status.h"

namespace moerr::formats {

absl::Status ValidateName(absl::string_view name, uint32_t max_bytes) {
  if (name.empty()) return absl::DataLossError("name is empty");
  if (name.size() > max_bytes) {
    return absl::DataLossError(absl::StrFormat("name is %d bytes, the limit is %d", name.size(), max_bytes));
  }
  if (name.find('\0') != absl::string_view::npos) {
    return absl::DataLossError(absl::StrFormat("name contains NUL at byte %d", name.find('\0')));
  }
  size_t bad = 0;
  if (!llvm::json::isUTF8(llvm::StringRef(name.data(), name.size()), &bad)) {
    return absl::DataLossError(absl::StrFormat("name is not valid UTF-8 (byte %d)", bad));
  }
  return absl::OkStatus();
}

namespace {

constexpr uint64_t kFirstPayload = kSuperblockSize + kFrameHeaderSize;

// A chunk's frame in the file, [begin, end), for the overlap check.
struct FrameRange {
  uint64_t begin, end;
  size_t blob, chunk;
};

// The features the file requires and the writer's version string.
absl::Status ValidateHeader(const IndexData& index, const Limits& limits) {
  if (const uint64_t unknown = index.required_features & ~kKnownFeatures; unknown != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "index: requires feature bits 0x%x this reader does not know; use a newer moerr", unknown));
  }
  if (!index.writer.empty()) {
    if (absl::Status s = ValidateName(index.writer, limits.max_name_bytes); !s.ok()) {
      return absl::DataLossError(absl::StrCat("index: writer version: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Chunk `c` of blob `b`: its size, alignment, place in the data area,
// shuffle and codec. Its frame's range goes to `ranges`.
absl::Status ValidateChunk(const ChunkInfo& chunk, size_t b, size_t c, uint64_t data_end, const Limits& limits,
                           std::vector<FrameRange>& ranges) {
  const std::string at = absl::StrFormat("index: blob %d: chunk %d at offset %d", b, c, chunk.offset);
  if (chunk.raw_size == 0 || chunk.raw_size > limits.max_chunk_bytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: rawSize %d is not in [1, %d]", at, chunk.raw_size, limits.max_chunk_bytes));
  }
  if (chunk.offset % 8 != 0) return absl::DataLossError(absl::StrCat(at, ": offset is not 8-byte aligned"));
  uint64_t end;
  if (chunk.offset < kFirstPayload || __builtin_add_overflow(chunk.offset, chunk.stored_size, &end) ||
      end > data_end) {
    return absl::DataLossError(absl::StrFormat("%s: range [%d, +%d) is outside the data area [%d, %d)", at,
                                               chunk.offset, chunk.stored_size, kFirstPayload, data_end));
  }
  if (chunk.shuffle != 1 && chunk.shuffle != 2 && chunk.shuffle != 4 && chunk.shuffle != 8) {
    return absl::DataLossError(absl::StrFormat("%s: shuffle %d is not 1, 2, 4 or 8", at, chunk.shuffle));
  }
  if (chunk.codec == Codec::kRaw && chunk.stored_size != chunk.raw_size) {
    return absl::DataLossError(
        absl::StrFormat("%s: raw chunk stores %d bytes but declares %d", at, chunk.stored_size, chunk.raw_size));
  }
  ranges.push_back(FrameRange{chunk.offset - kFrameHeaderSize, end, b, c});
  return absl::OkStatus();
}

// Blob `b`: its rank, its shape against its raw size, and its chunks, whose
// raw sizes add up to the blob's.
absl::Status ValidateBlob(const BlobInfo& blob, size_t b, uint64_t data_end, const Limits& limits,
                          std::vector<FrameRange>& ranges) {
  auto where = [&](absl::string_view field) { return absl::StrFormat("index: blob %d: %s", b, field); };
  if (blob.shape.size() > limits.max_rank) {
    return absl::DataLossError(
        absl::StrFormat("%s: rank %d exceeds %d", where("shape"), blob.shape.size(), limits.max_rank));
  }
  const auto bytes = CheckedNumel(blob.shape, ItemSize(blob.dtype));
  if (!bytes.ok()) return absl::DataLossError(absl::StrCat(where("shape"), ": ", bytes.status().message()));
  if (static_cast<uint64_t>(*bytes) != blob.raw_size) {
    return absl::DataLossError(absl::StrFormat("%s: shape x itemsize = %d bytes but rawSize = %d", where("rawSize"),
                                               *bytes, blob.raw_size));
  }
  uint64_t sum = 0;
  for (size_t c = 0; c < blob.chunks.size(); ++c) {
    MOERR_RETURN_IF_ERROR(ValidateChunk(blob.chunks[c], b, c, data_end, limits, ranges));
    if (__builtin_add_overflow(sum, blob.chunks[c].raw_size, &sum)) {
      return absl::DataLossError(absl::StrCat(where("chunks"), ": raw sizes overflow"));
    }
  }
  if (sum != blob.raw_size) {
    return absl::DataLossError(
        absl::StrFormat("%s: chunks hold %d bytes but rawSize = %d", where("chunks"), sum, blob.raw_size));
  }
  return absl::OkStatus();
}

// No two chunks' frames share a byte.
absl::Status ValidateNoOverlap(std::vector<FrameRange>& ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const FrameRange& a, const FrameRange& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return absl::DataLossError(absl::StrFormat(
          "index: blob %d chunk %d (frame at %d) overlaps blob %d chunk %d (frame [%d, %d))", ranges[i].blob,
          ranges[i].chunk, ranges[i].begin, ranges[i - 1].blob, ranges[i - 1].chunk, ranges[i - 1].begin,
          ranges[i - 1].end));
    }
  }
  return absl::OkStatus();
}

// Each tensor's name, its blob, and no two tensors of one step with one name.
absl::Status ValidateTensors(const IndexData& index, const Limits& limits) {
  absl::flat_hash_set<std::pair<absl::string_view, int64_t>> seen;
  seen.reserve(index.tensors.size());
  for (size_t t = 0; t < index.tensors.size(); ++t) {
    const TensorInfo& tensor = index.tensors[t];
    if (absl::Status s = ValidateName(tensor.name, limits.max_name_bytes); !s.ok()) {
      return Annotate(s, absl::StrFormat("index: tensor %d", t));
    }
    if (tensor.blob >= index.blobs.size()) {
      return absl::DataLossError(absl::StrFormat("index: tensor %d (%s): blob %d, but there are %d blobs", t,
                                                 tensor.name, tensor.blob, index.blobs.size()));
    }
    if (!seen.insert({tensor.name, tensor.step}).second) {
      return absl::DataLossError(
          absl::StrFormat("index: tensor %d: duplicate name \"%s\" at step %d", t, tensor.name, tensor.step));
    }
  }
  return absl::OkStatus();
}

// Each record's range lies in the data area, 8-byte aligned.
absl::Status ValidateRecords(const IndexData& index, uint64_t data_end) {
  for (size_t r = 0; r < index.records.size(); ++r) {
    const RecordRef& ref = index.records[r];
    uint64_t end;
    if (ref.offset < kFirstPayload || ref.offset % 8 != 0 || __builtin_add_overflow(ref.offset, ref.length, &end) ||
        end > data_end) {
      return absl::DataLossError(absl::StrFormat("index: record %d: range [%d, +%d) is outside the data area", r,
                                                 ref.offset, ref.length));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateIndex(const IndexData& index, uint64_t data_end, const Limits& limits) {
  MOERR_RETURN_IF_ERROR(ValidateHeader(index, limits));
  std::vector<FrameRange> ranges;
  for (size_t b = 0; b < index.blobs.size(); ++b) {
    MOERR_RETURN_IF_ERROR(ValidateBlob(index.blobs[b], b, data_end, limits, ranges));
  }
  MOERR_RETURN_IF_ERROR(ValidateNoOverlap(ranges));
  MOERR_RETURN_IF_ERROR(ValidateTensors(index, limits));
  return ValidateRecords(index, data_end);
}

}  // namespace moerr::formats
