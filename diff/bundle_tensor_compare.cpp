#include "diff/bundle_tensor_compare.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "support/status.h"

namespace moerr::diff {
namespace {

using formats::BlobInfo;
using formats::BundleReader;

// One blob's decoded bytes, a chunk at a time, in a buffer owned by the
// worker, whose capacity outlives the cursor.
class ChunkCursor {
 public:
  ChunkCursor(const BundleReader& reader, uint32_t blob, std::vector<std::byte>& buffer)
      : reader_(reader), blob_(blob), chunks_(reader.index().blobs[blob].chunks.size()), buffer_(buffer) {
    buffer_.clear();
  }

  // The decoded bytes not consumed yet, decoding the next chunk once the
  // current one is consumed; empty after the last chunk.
  absl::StatusOr<absl::Span<const std::byte>> Pending() {
    if (at_ == buffer_.size() && next_ < chunks_) {
      buffer_.resize(reader_.index().blobs[blob_].chunks[next_].raw_size);
      MOERR_RETURN_IF_ERROR(reader_.DecodeBlobChunk(blob_, next_, absl::MakeSpan(buffer_)));
      at_ = 0;
      ++next_;
    }
    return absl::MakeConstSpan(buffer_).subspan(at_);
  }
  void Consume(size_t bytes) { at_ += bytes; }

 private:
  const BundleReader& reader_;
  const uint32_t blob_;
  const size_t chunks_;
  std::vector<std::byte>& buffer_;
  size_t next_ = 0, at_ = 0;
};

// Whether every chunk of `blob` holds whole elements, so that streaming never
// splits one. The writer's chunks do (their size is a multiple of 8 bytes);
// a blob whose chunks do not is read whole instead.
bool WholeElements(const BlobInfo& blob) {
  const size_t item = formats::ItemSize(blob.dtype);
  return std::all_of(blob.chunks.begin(), blob.chunks.end(),
                     [&](const formats::ChunkInfo& c) { return c.raw_size % item == 0; });
}

struct Buffers {
  std::vector<std::byte> a, b;
};

absl::StatusOr<TensorMetrics> ComparePair(const BundleReader& ra, const BundleReader& rb, BlobPair pair,
                                          Buffers& buffers) {
  const BlobInfo& ia = ra.index().blobs.at(pair.a);
  const BlobInfo& ib = rb.index().blobs.at(pair.b);
  if (ia.shape != ib.shape) {
    return absl::InvalidArgumentError(absl::StrFormat("shapes differ: [%s] and [%s]", absl::StrJoin(ia.shape, ", "),
                                                      absl::StrJoin(ib.shape, ", ")));
  }
  if (!WholeElements(ia) || !WholeElements(ib)) {
    MOERR_ASSIGN_OR_RETURN(const formats::OwnedTensor ta, ra.ReadBlob(pair.a));
    MOERR_ASSIGN_OR_RETURN(const formats::OwnedTensor tb, rb.ReadBlob(pair.b));
    return CompareTensors(ta.view(), tb.view());
  }
  const size_t item_a = formats::ItemSize(ia.dtype), item_b = formats::ItemSize(ib.dtype);
  TensorComparison comparison(ia.dtype, ib.dtype);
  ChunkCursor ca(ra, pair.a, buffers.a), cb(rb, pair.b, buffers.b);
  // Both hold numel elements (validated: raw size == numel * item size), so
  // they run out together.
  for (;;) {
    MOERR_ASSIGN_OR_RETURN(const absl::Span<const std::byte> pa, ca.Pending());
    MOERR_ASSIGN_OR_RETURN(const absl::Span<const std::byte> pb, cb.Pending());
    const size_t n = std::min(pa.size() / item_a, pb.size() / item_b);
    if (n == 0) break;
    comparison.Add(pa.data(), pb.data(), static_cast<int64_t>(n));
    ca.Consume(n * item_a);
    cb.Consume(n * item_b);
  }
  return comparison.Finish();
}

}  // namespace

absl::StatusOr<std::vector<TensorMetrics>> CompareBlobPairs(const BundleReader& reader_a,
                                                            const BundleReader& reader_b,
                                                            absl::Span<const BlobPair> pairs, int threads) {
  std::vector<absl::StatusOr<TensorMetrics>> results(pairs.size(), absl::UnknownError("not compared"));
  std::atomic<size_t> next{0};
  // Each worker takes the next pair until none is left; BundleReader's const
  // methods are thread-safe and each worker has its own buffers.
  auto work = [&] {
    Buffers buffers;
    for (size_t i; (i = next.fetch_add(1)) < pairs.size();) {
      results[i] = ComparePair(reader_a, reader_b, pairs[i], buffers);
    }
  };
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers = std::min(pairs.size(), threads > 0 ? static_cast<size_t>(threads) : cores);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::vector<TensorMetrics> metrics;
  metrics.reserve(pairs.size());
  for (absl::StatusOr<TensorMetrics>& r : results) {
    if (!r.ok()) return r.status();
    metrics.push_back(*r);
  }
  return metrics;
}

}  // namespace moerr::diff
