#include "formats/frame.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "support/check.h"
#include "support/enum_table.h"
#include "xxhash.h"

namespace moerr::formats {
namespace {

template <typename T>
void Put(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}

template <typename T>
T Get(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// Superblock and footer end in an XXH3-64 of their first 56 bytes.
constexpr size_t kSelfHashAt = 56;

uint64_t SelfHash(const std::byte* block) { return XXH3_64bits(block, kSelfHashAt); }

}  // namespace

constexpr EnumName<FrameKind> kFrameKinds[] = {{FrameKind::kChunk, "chunk"},
                                               {FrameKind::kRecord, "record"},
                                               {FrameKind::kCheckpoint, "checkpoint"},
                                               {FrameKind::kIndex, "index"}};

absl::string_view FrameKindName(uint32_t kind) { return EnumNameOf(kFrameKinds, static_cast<FrameKind>(kind)); }

uint64_t FrameHash(uint32_t kind, uint32_t flags, absl::Span<const std::byte> payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(), (uint64_t{kind} << 32) | flags);
}

std::array<std::byte, kSuperblockSize> EncodeSuperblock(const Superblock& s) {
  std::array<std::byte, kSuperblockSize> out{};
  std::memcpy(out.data(), kSuperblockMagic.data(), 8);
  Put<uint16_t>(&out[8], s.major);
  Put<uint16_t>(&out[10], s.minor);
  Put<uint32_t>(&out[12], s.flags);
  std::memcpy(&out[16], s.uuid.data(), 16);
  Put<uint64_t>(&out[kSelfHashAt], SelfHash(out.data()));
  return out;
}

absl::StatusOr<Superblock> DecodeSuperblock(absl::Span<const std::byte> bytes) {
  // Bad input (kInvalidArgument) unless the file begins as a bundle does;
  // after that, missing or wrong bytes are damage (kDataLoss).
  if (bytes.empty()) return absl::InvalidArgumentError("the file is empty, not a moerr bundle");
  if (std::memcmp(bytes.data(), kSuperblockMagic.data(), std::min<size_t>(bytes.size(), 8)) != 0) {
    return absl::InvalidArgumentError("superblock at offset 0: wrong magic, not a moerr bundle");
  }
  if (bytes.size() < kSuperblockSize) {
    return absl::DataLossError(absl::StrFormat("superblock: file has %d bytes, need %d", bytes.size(),
                                               kSuperblockSize));
  }
  if (Get<uint64_t>(&bytes[kSelfHashAt]) != SelfHash(bytes.data())) {
    return absl::DataLossError("superblock at offset 0: checksum mismatch");
  }
  Superblock s;
  s.major = Get<uint16_t>(&bytes[8]);
  s.minor = Get<uint16_t>(&bytes[10]);
  s.flags = Get<uint32_t>(&bytes[12]);
  std::memcpy(s.uuid.data(), &bytes[16], 16);
  return s;
}

std::array<std::byte, kFrameHeaderSize> EncodeFrameHeader(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderSize> out{};
  Put<uint32_t>(&out[0], h.kind);
  Put<uint32_t>(&out[4], h.flags);
  Put<uint64_t>(&out[8], h.length);
  Put<uint64_t>(&out[16], h.hash);
  return out;
}

std::vector<std::byte> EncodeFrame(FrameKind kind, uint32_t flags, absl::Span<const std::byte> payload) {
  const uint32_t k = static_cast<uint32_t>(kind);
  const auto header = EncodeFrameHeader(FrameHeader{k, flags, payload.size(), FrameHash(k, flags, payload)});
  std::vector<std::byte> frame(kFrameHeaderSize + PaddedLength(payload.size()), std::byte{0});
  std::memcpy(frame.data(), header.data(), kFrameHeaderSize);
  std::memcpy(frame.data() + kFrameHeaderSize, payload.data(), payload.size());
  return frame;
}

FrameHeader DecodeFrameHeader(absl::Span<const std::byte> bytes) {
  MOERR_CHECK(bytes.size() >= kFrameHeaderSize) << bytes.size();
  return FrameHeader{Get<uint32_t>(&bytes[0]), Get<uint32_t>(&bytes[4]), Get<uint64_t>(&bytes[8]),
                     Get<uint64_t>(&bytes[16])};
}

std::array<std::byte, kFooterSize> EncodeFooter(const Footer& f) {
  std::array<std::byte, kFooterSize> out{};
  std::memcpy(out.data(), kFooterMagic.data(), 8);
  Put<uint64_t>(&out[8], f.index_offset);
  Put<uint64_t>(&out[16], f.index_length);
  Put<uint64_t>(&out[24], f.index_hash);
  Put<uint64_t>(&out[kSelfHashAt], SelfHash(out.data()));
  return out;
}

absl::StatusOr<Footer> DecodeFooter(absl::Span<const std::byte> bytes) {
  MOERR_CHECK(bytes.size() == kFooterSize) << bytes.size();
  if (std::memcmp(bytes.data(), kFooterMagic.data(), 8) != 0) {
    return absl::DataLossError(
        "footer: no footer magic at the end of the file; the writer did not finish (crashed or still "
        "running). `moerr salvage` rebuilds the index from the complete frames");
  }
  if (Get<uint64_t>(&bytes[kSelfHashAt]) != SelfHash(bytes.data())) {
    return absl::DataLossError("footer: checksum mismatch");
  }
  return Footer{Get<uint64_t>(&bytes[8]), Get<uint64_t>(&bytes[16]), Get<uint64_t>(&bytes[24])};
}

}  // namespace moerr::formats
