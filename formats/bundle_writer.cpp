#include "formats/bundle_writer.h"

#include <chrono>
#include <future>
#include <optional>
#include <random>

#include "absl/strings/str_format.h"
#include "formats/chunk_codec.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/Threading.h"
#include "support/check.h"
#include "support/status.h"
#include "support/version.h"

namespace moerr::formats {
namespace {

// Each worker keeps one encoder (its zstd context and scratch) for its life.
ChunkEncoder& WorkerEncoder(int level) {
  thread_local std::unique_ptr<ChunkEncoder> encoder;
  thread_local int encoder_level = -1;
  if (!encoder || encoder_level != level) {
    encoder = std::make_unique<ChunkEncoder>(level);
    encoder_level = level;
  }
  return *encoder;
}

}  // namespace

// One chunk on its way to the file. `raw` points into `copy` or into memory
// kept alive by `owner`.
struct BundleWriter::ChunkJob {
  absl::Span<const std::byte> raw;
  std::vector<std::byte> copy;
  std::shared_ptr<const void> owner;
  int item_size = 1;
  uint32_t blob = 0;
  EncodedChunk encoded;
  uint64_t hash = 0;
};

// Items leave the queue in order: a blob's chunks, then its blob record, then
// the tensor record; so a record never names bytes not yet in the file.
struct BundleWriter::Pending {
  std::shared_ptr<ChunkJob> chunk;  // set for a chunk
  std::shared_future<void> encoded;
  std::optional<Record> record;     // set for a blob or tensor record: it is
                                    // completed from index_ when written
  std::vector<std::byte> encoded_record;  // any other record, encoded by the
  uint32_t flags = 0;                     // thread that appended it
  uint16_t kind = 0;
  int64_t step = -1;
};

absl::StatusOr<std::unique_ptr<BundleWriter>> BundleWriter::Create(const std::string& path,
                                                                   WriterOptions options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes > (uint64_t{64} << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk size %d is not in [1, 64 MiB]", options.chunk_bytes));
  }
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<FileSink> sink, FileSink::Create(path, options.overwrite));
  Superblock super;
  std::random_device rd;
  for (auto& b : super.uuid) b = static_cast<uint8_t>(rd());
  MOERR_RETURN_IF_ERROR(sink->Write(EncodeSuperblock(super)));
  return std::unique_ptr<BundleWriter>(new BundleWriter(options, std::move(sink)));
}

BundleWriter::BundleWriter(WriterOptions options, std::unique_ptr<FileSink> sink)
    : options_(options), sink_(std::move(sink)) {
  index_.writer = moerr::Version();
  const int threads = options_.threads > 0 ? options_.threads : llvm::hardware_concurrency().compute_thread_count();
  pool_ = std::make_unique<llvm::ThreadPool>(llvm::hardware_concurrency(threads));
  max_pending_chunks_ = 2 * static_cast<size_t>(threads) + 2;
}

BundleWriter::~BundleWriter() {
  if (!closed_ && failed_.ok()) (void)Drain();
  pool_->wait();
}

absl::Status BundleWriter::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = status;
  return status;
}

absl::StatusOr<uint64_t> BundleWriter::WriteFrame(FrameKind kind, uint32_t flags,
                                                  absl::Span<const std::byte> payload, uint64_t hash) {
  absl::StatusOr<uint64_t> at = sink_->WriteFrame(kind, flags, payload, hash);
  if (!at.ok()) return Fail(at.status());
  return at;
}

BundleWriter::Pending BundleWriter::Encoded(const Record& record) {
  Pending item;
  item.encoded_record = EncodeRecordFrame(record, &item.flags);
  item.kind = record.kind;
  item.step = record.step;
  return item;
}

absl::Status BundleWriter::WriteRecord(uint16_t kind, int64_t step, absl::Span<const std::byte> bytes,
                                       uint32_t flags) {
  MOERR_ASSIGN_OR_RETURN(const uint64_t at, WriteFrame(FrameKind::kRecord, flags, bytes,
                                                       FrameHash(uint32_t(FrameKind::kRecord), flags, bytes)));
  if (flags & kRecordZstd) index_.required_features |= kFeatureZstdRecords;
  const auto k = static_cast<RecordKind>(kind);
  if (k != RecordKind::kBlob && k != RecordKind::kTensor) index_.records.push_back(RecordRef{kind, step, at, bytes.size()});
  return absl::OkStatus();
}

absl::Status BundleWriter::WriteOne(Pending& item) {
  if (item.chunk) {
    item.encoded.wait();
    ChunkJob& job = *item.chunk;
    const uint32_t flags = static_cast<uint32_t>(job.encoded.codec) | (uint32_t{job.encoded.shuffle} << 8);
    MOERR_ASSIGN_OR_RETURN(const uint64_t at, WriteFrame(FrameKind::kChunk, flags, job.encoded.payload, job.hash));
    index_.blobs[job.blob].chunks.push_back(
        ChunkInfo{at, job.encoded.payload.size(), job.raw.size(), job.encoded.codec, job.encoded.shuffle});
    stats_.stored_bytes += job.encoded.payload.size();
    --pending_chunks_;
    return absl::OkStatus();
  }
  if (!item.record) return WriteRecord(item.kind, item.step, item.encoded_record, item.flags);
  Record& record = *item.record;
  if (record.kind == static_cast<uint16_t>(RecordKind::kBlob)) record.blob = index_.blobs[record.tensor.blob];
  if (record.kind == static_cast<uint16_t>(RecordKind::kTensor)) index_.tensors.push_back(record.tensor);
  return WriteRecord(record.kind, record.step, EncodeRecord(record), 0);
}

absl::Status BundleWriter::Enqueue(Pending item) {
  if (item.chunk) ++pending_chunks_;
  pending_.push_back(std::move(item));
  // In order, from the front: whatever is ready (a record, a chunk whose
  // encoding finished), so records do not wait behind a finished chunk for
  // the next drain (a killed process would lose them); and, for bounded
  // memory, whatever is first while too many chunks are in flight.
  auto ready = [](const Pending& p) {
    return !p.chunk || p.encoded.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  };
  while (pending_chunks_ > max_pending_chunks_ || (!pending_.empty() && ready(pending_.front()))) {
    MOERR_RETURN_IF_ERROR(WriteOne(pending_.front()));
    pending_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status BundleWriter::Drain() {
  while (!pending_.empty()) {
    MOERR_RETURN_IF_ERROR(WriteOne(pending_.front()));
    pending_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status BundleWriter::PutTensor(absl::string_view name, Role role, int64_t step, const TensorView& view) {
  MOERR_RETURN_IF_ERROR(failed_);
  MOERR_CHECK(!closed_) << "PutTensor after Close";
  if (absl::Status s = ValidateName(name, Limits().max_name_bytes); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("tensor \"%s\": %s", name, s.message()));
  }
  if (!names_.insert({std::string(name), step}).second) {
    return absl::AlreadyExistsError(absl::StrFormat("tensor \"%s\" at step %d is already in the bundle", name, step));
  }
  const int item = ItemSize(view.dtype);
  MOERR_ASSIGN_OR_RETURN(const int64_t nbytes, CheckedNumel(view.shape, item));

  // Contiguous bytes: the caller's, or a copy when strided.
  std::shared_ptr<const void> owner = view.owner;
  absl::Span<const std::byte> bytes;
  if (view.IsContiguous()) {
    bytes = absl::MakeConstSpan(view.data, nbytes);
  } else {
    auto copy = std::make_shared<std::vector<std::byte>>(nbytes);
    CopyToContiguous(view, copy->data());
    bytes = *copy;
    owner = copy;
  }
  const BlobHash hash = ComputeBlobHash(view.dtype, view.shape, bytes);
  auto [it, is_new] = blob_by_hash_.try_emplace(hash, static_cast<uint32_t>(index_.blobs.size()));
  const uint32_t blob = it->second;
  if (is_new) {
    BlobInfo info;
    info.hash = hash;
    info.dtype = view.dtype;
    info.shape = view.shape;
    info.raw_size = nbytes;
    index_.blobs.push_back(std::move(info));
    ++stats_.blobs;
    stats_.raw_bytes += nbytes;
    // Chunks hold whole elements: chunk_bytes is rounded down to the item size.
    const uint64_t step_bytes = std::max<uint64_t>(item, options_.chunk_bytes / item * item);
    for (uint64_t begin = 0; begin < static_cast<uint64_t>(nbytes); begin += step_bytes) {
      auto job = std::make_shared<ChunkJob>();
      const uint64_t len = std::min<uint64_t>(step_bytes, nbytes - begin);
      job->item_size = item;
      job->blob = blob;
      if (owner) {
        job->raw = bytes.subspan(begin, len);
        job->owner = owner;
      } else {
        job->copy.assign(bytes.begin() + begin, bytes.begin() + begin + len);
        job->raw = job->copy;
      }
      const int level = options_.zstd_level;
      const bool compress = options_.compress;
      std::shared_future<void> done = pool_->async([job, level, compress] {
        if (compress) {
          WorkerEncoder(level).Encode(job->raw, job->item_size, job->encoded);
        } else {
          job->encoded.codec = Codec::kRaw;
          job->encoded.shuffle = 1;
          job->encoded.payload = job->raw;  // the job keeps the bytes alive until they are written
        }
        const uint32_t flags = static_cast<uint32_t>(job->encoded.codec) | (uint32_t{job->encoded.shuffle} << 8);
        job->hash = FrameHash(static_cast<uint32_t>(FrameKind::kChunk), flags, job->encoded.payload);
      });
      MOERR_RETURN_IF_ERROR(Enqueue(Pending{std::move(job), std::move(done), std::nullopt, {}}));
    }
    Record blob_record;
    blob_record.kind = static_cast<uint16_t>(RecordKind::kBlob);
    blob_record.step = step;
    blob_record.tensor.blob = blob;  // which blob to describe when written
    MOERR_RETURN_IF_ERROR(Enqueue(Pending{nullptr, {}, std::move(blob_record), {}}));
  }
  Record tensor_record;
  tensor_record.kind = static_cast<uint16_t>(RecordKind::kTensor);
  tensor_record.step = step;
  tensor_record.tensor = TensorInfo{std::string(name), role, step, blob};
  ++stats_.tensors;
  return Enqueue(Pending{nullptr, {}, std::move(tensor_record), {}});
}

absl::Status BundleWriter::BeginStep(int64_t step) {
  MOERR_RETURN_IF_ERROR(failed_);
  Record record;
  record.kind = static_cast<uint16_t>(RecordKind::kStepBegin);
  record.step = step;
  return Enqueue(Encoded(record));
}

absl::Status BundleWriter::EndStep(int64_t step) {
  MOERR_RETURN_IF_ERROR(failed_);
  Record record;
  record.kind = static_cast<uint16_t>(RecordKind::kStepEnd);
  record.step = step;
  MOERR_RETURN_IF_ERROR(Enqueue(Encoded(record)));
  return Checkpoint();
}

absl::Status BundleWriter::Annotate(absl::string_view key, llvm::json::Value value, int64_t step) {
  MOERR_RETURN_IF_ERROR(failed_);
  Record record;
  record.kind = static_cast<uint16_t>(RecordKind::kAnnotation);
  record.step = step;
  record.key = std::string(key);
  record.value = std::move(value);
  return Enqueue(Encoded(record));
}

absl::Status BundleWriter::AppendRecord(const Record& record) {
  MOERR_RETURN_IF_ERROR(failed_);
  const auto kind = static_cast<RecordKind>(record.kind);
  MOERR_CHECK(kind != RecordKind::kBlob && kind != RecordKind::kTensor) << "blob and tensor records come from PutTensor";
  return Enqueue(Encoded(record));
}

absl::Status BundleWriter::Checkpoint() {
  MOERR_RETURN_IF_ERROR(failed_);
  MOERR_RETURN_IF_ERROR(Drain());
  const std::vector<std::byte> index = EncodeIndex(index_);
  return WriteFrame(FrameKind::kCheckpoint, 0, index, FrameHash(uint32_t(FrameKind::kCheckpoint), 0, index)).status();
}

absl::Status BundleWriter::Close() {
  MOERR_RETURN_IF_ERROR(failed_);
  MOERR_CHECK(!closed_) << "Close twice";
  MOERR_RETURN_IF_ERROR(Drain());
  if (absl::Status s = sink_->Commit(EncodeIndex(index_), options_.sync); !s.ok()) return Fail(s);
  closed_ = true;
  stats_.file_bytes = sink_->offset();
  return absl::OkStatus();
}

}  // namespace moerr::formats
