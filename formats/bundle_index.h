// The in-memory model of a bundle's index and records, and their Cap'n Proto
// encoding. Cap'n Proto is decoded once, inside the kj boundary, into these
// plain structs; nothing else in moerr touches Cap'n Proto readers, so a
// hostile message can throw only here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/chunk_codec.h"
#include "formats/dtype.h"
#include "formats/limits.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

// Values match the `Role` enum in bundle.capnp.
enum class Role : uint8_t {
  kOther = 0,
  kParameter = 1,
  kOptimizerState = 2,
  kBatch = 3,
  kLeaf = 4,
  kActivation = 5,
  kGradient = 6,
  kRng = 7,
  kReceived = 8,
};
inline constexpr int kNumRoles = 9;
absl::string_view RoleName(Role role);

// Values are Record's union discriminants in bundle.capnp.
enum class RecordKind : uint16_t {
  kBlob = 0,
  kTensor = 1,
  kStepBegin = 2,
  kStepEnd = 3,
  kAnnotation = 4,
  kOps = 5,
  kRouting = 6,
};
absl::string_view RecordKindName(uint16_t kind);

struct ChunkInfo {
  uint64_t offset = 0;       // payload offset in the file
  uint64_t stored_size = 0;  // payload bytes
  uint64_t raw_size = 0;     // decoded bytes
  Codec codec = Codec::kRaw;
  uint8_t shuffle = 1;
};

struct BlobHash {
  uint64_t low = 0;
  uint64_t high = 0;
  bool operator==(const BlobHash& o) const { return low == o.low && high == o.high; }
  template <typename H>
  friend H AbslHashValue(H h, const BlobHash& b) {
    return H::combine(std::move(h), b.low, b.high);
  }
};

// XXH3-128 over the bytes, then the dtype byte, then the shape as int64s:
// equal hashes mean the same tensor, not just the same bytes.
BlobHash ComputeBlobHash(DType dtype, absl::Span<const int64_t> shape, absl::Span<const std::byte> bytes);

struct BlobInfo {
  BlobHash hash;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t raw_size = 0;
  std::vector<ChunkInfo> chunks;

  uint64_t StoredSize() const;
};

struct TensorInfo {
  std::string name;
  Role role = Role::kOther;
  int64_t step = -1;
  uint32_t blob = 0;
};

struct RecordRef {
  uint16_t kind = 0;
  int64_t step = -1;
  uint64_t offset = 0;  // payload offset of the record frame
  uint64_t length = 0;
};

struct IndexData {
  uint64_t required_features = 0;
  std::string writer;  // the moerr version that wrote the file; "" before 0.1.0
  std::vector<BlobInfo> blobs;
  std::vector<TensorInfo> tensors;
  std::vector<RecordRef> records;
};

// One decoded record. Which member is meaningful follows `kind`.
struct Record {
  int64_t step = -1;
  uint16_t kind = 0;
  BlobInfo blob;                  // kBlob
  TensorInfo tensor;              // kTensor
  std::string key;                // kAnnotation
  llvm::json::Value value = nullptr;  // kAnnotation
  OpBatch ops;                    // kOps
  RoutingRecord routing;          // kRouting
};

// Cap'n Proto flat-array encodings (one segment, 8-byte aligned sizes).
std::vector<std::byte> EncodeIndex(const IndexData& index);
std::vector<std::byte> EncodeRecord(const Record& record);

// Decodes a message at file offset `offset` (used in error messages). Checks
// the segment table against `limits` before Cap'n Proto sees it, then decodes
// under the traversal and nesting limits.
absl::StatusOr<IndexData> DecodeIndex(absl::Span<const std::byte> payload, uint64_t offset,
                                      const Limits& limits);
absl::StatusOr<Record> DecodeRecord(absl::Span<const std::byte> payload, uint64_t offset,
                                    const Limits& limits);
// A record frame's payload: the record of 4 KiB or more zstd-compressed
// (flags kRecordZstd) by the chunk codec when that pays, else as is.
std::vector<std::byte> EncodeRecordFrame(const Record& record, uint32_t* flags);
// Decodes a record frame's payload given its header flags.
absl::StatusOr<Record> DecodeRecordFrame(absl::Span<const std::byte> payload, uint32_t flags, uint64_t offset,
                                         const Limits& limits);

// The semantic checks of DESIGN.md's reader: counts, names, shapes
// (overflow-checked numel == raw size), chunk ranges (inside [header end,
// `data_end`), aligned, not overlapping), blob references, required features.
absl::Status ValidateIndex(const IndexData& index, uint64_t data_end, const Limits& limits);

// Name rules: non-empty, at most `max_bytes`, valid UTF-8, no NUL.
absl::Status ValidateName(absl::string_view name, uint32_t max_bytes);

}  // namespace moerr::formats
