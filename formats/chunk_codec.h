// Chunk encoding: byte-shuffle by element size, then one zstd frame (level 1,
// checksum on, content size set), or the raw bytes when compression does not
// pay. Shuffling groups the i-th byte of every element together, so the
// exponent bytes of floats compress well.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace moerr::formats {

enum class Codec : uint8_t { kRaw = 0, kZstd = 1 };

struct EncodedChunk {
  Codec codec = Codec::kRaw;
  uint8_t shuffle = 1;                     // element size shuffled by; 1 = none
  absl::Span<const std::byte> payload;     // into `buffer`, or into the input when raw
  std::vector<std::byte> buffer;
};

// Byte (un)shuffle of `in` into `out` (same size, a multiple of `item_size`).
void Shuffle(absl::Span<const std::byte> in, std::byte* out, int item_size);
void Unshuffle(absl::Span<const std::byte> in, std::byte* out, int item_size);

// Encodes `raw` (elements of `item_size` bytes). Not thread-safe: use one
// encoder per worker; it keeps its zstd context and scratch between calls.
class ChunkEncoder {
 public:
  explicit ChunkEncoder(int zstd_level = 1);
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // `out.payload` may point into `raw`; keep `raw` alive until it is written.
  void Encode(absl::Span<const std::byte> raw, int item_size, EncodedChunk& out);

 private:
  void* cctx_;  // ZSTD_CCtx
  std::vector<std::byte> shuffled_;
};

// Decodes one chunk into `out` (exactly `out.size()` == the declared raw size).
// Checks everything the payload claims before trusting it: raw size, zstd
// frame content size, a single frame, the zstd checksum.
absl::Status DecodeChunk(absl::Span<const std::byte> payload, Codec codec, int shuffle,
                         absl::Span<std::byte> out);

}  // namespace moerr::formats
