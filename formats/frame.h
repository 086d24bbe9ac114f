// The fixed-size pieces of a bundle file (DESIGN.md, "Bundle format (v1)"):
//
//   superblock (64 B) | frame* | index frame | footer (64 B)
//
// A frame is a 24-byte header {kind u32, flags u32, length u64, hash u64}, then
// `length` payload bytes, then zero padding to the next multiple of 8, so every
// payload starts 8-byte aligned (Cap'n Proto reads records in place). `hash` is
// XXH3-64 of the payload seeded with (kind << 32 | flags), so a frame whose
// header or payload changed no longer checks. All integers are little-endian.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moerr::formats {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bundles are little-endian");

inline constexpr uint16_t kMajorVersion = 1;
inline constexpr uint16_t kMinorVersion = 0;
inline constexpr size_t kSuperblockSize = 64;
inline constexpr size_t kFrameHeaderSize = 24;
inline constexpr size_t kFooterSize = 64;
inline constexpr absl::string_view kSuperblockMagic{"MOERRBN\0", 8};
inline constexpr absl::string_view kFooterMagic{"MOERRFT\0", 8};
// Index.requiredFeatures bits.
inline constexpr uint64_t kFeatureZstdRecords = 1;  // some record frames carry kRecordZstd
inline constexpr uint64_t kKnownFeatures = kFeatureZstdRecords;
// Record frame flags: the payload is one zstd frame (with its content size)
// of the Cap'n Proto record.
inline constexpr uint32_t kRecordZstd = 1;

enum class FrameKind : uint32_t {
  kChunk = 1,       // encoded tensor bytes (Chunk in bundle.capnp says how)
  kRecord = 2,      // a Cap'n Proto Record
  kCheckpoint = 3,  // a Cap'n Proto Index of everything before it
  kIndex = 4,       // the final Cap'n Proto Index; the footer points at it
};
absl::string_view FrameKindName(uint32_t kind);

struct Superblock {
  uint16_t major = kMajorVersion;
  uint16_t minor = kMinorVersion;
  uint32_t flags = 0;
  std::array<uint8_t, 16> uuid{};
};

struct FrameHeader {
  uint32_t kind = 0;  // raw, so that readers can report unknown kinds
  uint32_t flags = 0;
  uint64_t length = 0;
  uint64_t hash = 0;
};

struct Footer {
  uint64_t index_offset = 0;  // payload offset of the index frame
  uint64_t index_length = 0;  // payload bytes
  uint64_t index_hash = 0;    // the index frame's hash
};

inline uint64_t PaddedLength(uint64_t length) { return (length + 7) & ~uint64_t{7}; }

// XXH3-64 of `payload` seeded from kind and flags: the frame hash.
uint64_t FrameHash(uint32_t kind, uint32_t flags, absl::Span<const std::byte> payload);

std::array<std::byte, kSuperblockSize> EncodeSuperblock(const Superblock& s);
// Checks magic and the superblock's own hash; the version is the caller's call.
absl::StatusOr<Superblock> DecodeSuperblock(absl::Span<const std::byte> bytes);

std::array<std::byte, kFrameHeaderSize> EncodeFrameHeader(const FrameHeader& h);
FrameHeader DecodeFrameHeader(absl::Span<const std::byte> bytes);

// A whole frame (header, payload, zero padding), for a writer that cannot go
// through FileSink: the recorder's signal handler appends prepared frames.
std::vector<std::byte> EncodeFrame(FrameKind kind, uint32_t flags, absl::Span<const std::byte> payload);

std::array<std::byte, kFooterSize> EncodeFooter(const Footer& f);
// Checks magic and the footer's own hash.
absl::StatusOr<Footer> DecodeFooter(absl::Span<const std::byte> bytes);

}  // namespace moerr::formats
