#include "formats/chunk_codec.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "support/check.h"
#include "zstd.h"

namespace moerr::formats {
namespace {

template <int kItem>
void ShuffleFixed(const std::byte* in, std::byte* out, size_t n) {
  for (size_t i = 0; i < n; ++i)
    for (int b = 0; b < kItem; ++b) out[b * n + i] = in[i * kItem + b];
}

template <int kItem>
void UnshuffleFixed(const std::byte* in, std::byte* out, size_t n) {
  for (size_t i = 0; i < n; ++i)
    for (int b = 0; b < kItem; ++b) out[i * kItem + b] = in[b * n + i];
}

// Stored raw unless zstd saves at least this share of the bytes.
constexpr double kMinSaving = 0.03;

struct DCtxHolder {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  ~DCtxHolder() { ZSTD_freeDCtx(ctx); }
};

}  // namespace

void Shuffle(absl::Span<const std::byte> in, std::byte* out, int item_size) {
  const size_t n = in.size() / item_size;
  MOERR_CHECK(n * item_size == in.size()) << in.size() << " bytes, item " << item_size;
  switch (item_size) {
    case 2: return ShuffleFixed<2>(in.data(), out, n);
    case 4: return ShuffleFixed<4>(in.data(), out, n);
    case 8: return ShuffleFixed<8>(in.data(), out, n);
    default: std::memcpy(out, in.data(), in.size());
  }
}

void Unshuffle(absl::Span<const std::byte> in, std::byte* out, int item_size) {
  const size_t n = in.size() / item_size;
  MOERR_CHECK(n * item_size == in.size()) << in.size() << " bytes, item " << item_size;
  switch (item_size) {
    case 2: return UnshuffleFixed<2>(in.data(), out, n);
    case 4: return UnshuffleFixed<4>(in.data(), out, n);
    case 8: return UnshuffleFixed<8>(in.data(), out, n);
    default: std::memcpy(out, in.data(), in.size());
  }
}

ChunkEncoder::ChunkEncoder(int zstd_level) : cctx_(ZSTD_createCCtx()) {
  auto* cctx = static_cast<ZSTD_CCtx*>(cctx_);
  MOERR_CHECK(cctx != nullptr);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, zstd_level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
}

ChunkEncoder::~ChunkEncoder() { ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_)); }

void ChunkEncoder::Encode(absl::Span<const std::byte> raw, int item_size, EncodedChunk& out) {
  const int shuffle = (item_size == 2 || item_size == 4 || item_size == 8) ? item_size : 1;
  absl::Span<const std::byte> input = raw;
  if (shuffle > 1) {
    shuffled_.resize(raw.size());
    Shuffle(raw, shuffled_.data(), shuffle);
    input = shuffled_;
  }
  out.buffer.resize(ZSTD_compressBound(input.size()));
  const size_t n = ZSTD_compress2(static_cast<ZSTD_CCtx*>(cctx_), out.buffer.data(), out.buffer.size(),
                                  input.data(), input.size());
  MOERR_CHECK(!ZSTD_isError(n)) << "zstd: " << ZSTD_getErrorName(n);
  if (static_cast<double>(n) <= (1.0 - kMinSaving) * static_cast<double>(raw.size())) {
    out.codec = Codec::kZstd;
    out.shuffle = static_cast<uint8_t>(shuffle);
    out.payload = absl::MakeConstSpan(out.buffer.data(), n);
  } else {
    out.codec = Codec::kRaw;
    out.shuffle = 1;
    out.payload = raw;
  }
}

absl::Status DecodeChunk(absl::Span<const std::byte> payload, Codec codec, int shuffle,
                         absl::Span<std::byte> out) {
  if (shuffle != 1 && shuffle != 2 && shuffle != 4 && shuffle != 8) {
    return absl::DataLossError(absl::StrFormat("shuffle %d is not 1, 2, 4 or 8", shuffle));
  }
  if (out.size() % shuffle != 0) {
    return absl::DataLossError(
        absl::StrFormat("raw size %d is not a multiple of the shuffle %d", out.size(), shuffle));
  }
  if (codec == Codec::kRaw) {
    if (shuffle != 1) return absl::DataLossError("a raw chunk must not be shuffled");
    if (payload.size() != out.size()) {
      return absl::DataLossError(absl::StrFormat("raw chunk stores %d bytes but declares %d",
                                                 payload.size(), out.size()));
    }
    std::memcpy(out.data(), payload.data(), out.size());
    return absl::OkStatus();
  }
  if (codec != Codec::kZstd) return absl::DataLossError(absl::StrFormat("unknown codec %d", int(codec)));
  const unsigned long long content = ZSTD_getFrameContentSize(payload.data(), payload.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) return absl::DataLossError("not a zstd frame");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) return absl::DataLossError("zstd frame without a content size");
  if (content != out.size()) {
    return absl::DataLossError(absl::StrFormat("zstd frame content size %d != declared raw size %d",
                                               content, out.size()));
  }
  const size_t frame = ZSTD_findFrameCompressedSize(payload.data(), payload.size());
  if (ZSTD_isError(frame) || frame != payload.size()) {
    return absl::DataLossError("chunk payload is not exactly one complete zstd frame");
  }
  thread_local DCtxHolder dctx;
  thread_local std::vector<std::byte> scratch;
  std::byte* target = out.data();
  if (shuffle > 1) {
    scratch.resize(out.size());
    target = scratch.data();
  }
  const size_t n = ZSTD_decompressDCtx(dctx.ctx, target, out.size(), payload.data(), payload.size());
  if (ZSTD_isError(n)) return absl::DataLossError(absl::StrCat("zstd: ", ZSTD_getErrorName(n)));
  if (n != out.size()) {
    return absl::DataLossError(absl::StrFormat("zstd produced %d bytes, declared %d", n, out.size()));
  }
  if (shuffle > 1) Unshuffle(absl::MakeConstSpan(scratch.data(), n), out.data(), shuffle);
  return absl::OkStatus();
}

}  // namespace moerr::formats
