// Writes a bundle: superblock, frames, index, footer (frame.h). The file is
// written as PATH.partial and renamed at Close, so a finished bundle is never
// half-written; a crash leaves PATH.partial, which `moerr salvage` recovers
// up to its last complete frame.
//
// Tensor bytes are split into chunks, encoded (chunk_codec.h) by a pool of
// workers, one encoder each, and written in order by the calling thread while
// later chunks are still compressing.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "formats/bundle_index.h"
#include "formats/file_sink.h"
#include "formats/frame.h"
#include "formats/tensor_view.h"

namespace llvm {
class ThreadPool;
}

namespace moerr::formats {

struct WriterOptions {
  // Replace an existing bundle at the path (the CLI's --force). Default: refuse.
  bool overwrite = false;
  // Compression workers; 0 = one per core.
  int threads = 0;
  // zstd level; 1 is near the speed of the disk.
  int zstd_level = 1;
  // Off: chunks are stored raw, with no encoding work (a file that lives a
  // few steps, as the anomaly ring's slots do, trades disk for CPU).
  bool compress = true;
  // Bytes per chunk, before encoding. Default 4 MiB.
  uint64_t chunk_bytes = uint64_t{4} << 20;
  // fsync the file and its directory at Close (crash safety). Default on.
  bool sync = true;

  WriterOptions& set_overwrite(bool v) { overwrite = v; return *this; }
  WriterOptions& set_threads(int v) { threads = v; return *this; }
  WriterOptions& set_chunk_bytes(uint64_t v) { chunk_bytes = v; return *this; }
  WriterOptions& set_sync(bool v) { sync = v; return *this; }
  WriterOptions& set_compress(bool v) { compress = v; return *this; }
};

struct WriteStats {
  uint64_t tensors = 0;
  uint64_t blobs = 0;         // distinct contents stored
  uint64_t raw_bytes = 0;     // bytes of distinct contents
  uint64_t stored_bytes = 0;  // chunk payload bytes written
  uint64_t file_bytes = 0;
};

class BundleWriter {
 public:
  static absl::StatusOr<std::unique_ptr<BundleWriter>> Create(const std::string& path,
                                                              WriterOptions options = {});
  // Without Close, waits for pending chunks and leaves PATH.partial in place.
  ~BundleWriter();

  // Stores `view` as tensor (name, step); identical content (bytes, dtype,
  // shape) is stored once. (name, step) must be new and the name valid.
  absl::Status PutTensor(absl::string_view name, Role role, int64_t step, const TensorView& view);
  absl::Status BeginStep(int64_t step);
  // Marks `step` complete and writes a checkpoint frame.
  absl::Status EndStep(int64_t step);
  absl::Status Annotate(absl::string_view key, llvm::json::Value value, int64_t step = -1);
  // Appends a record of any kind but blob and tensor (those come from
  // PutTensor): ops, routing, ...
  absl::Status AppendRecord(const Record& record);
  // Writes everything pending, then a checkpoint frame (a partial index).
  absl::Status Checkpoint();
  // Writes everything pending to the file (no checkpoint frame): a process
  // killed after it loses nothing written before, salvage finds it all.
  absl::Status Flush() {
    if (!failed_.ok()) return failed_;
    return Drain();
  }
  // Writes the index and footer, syncs, and renames PATH.partial to PATH.
  absl::Status Close();

  const std::string& path() const { return sink_->path(); }
  std::string partial_path() const { return sink_->partial_path(); }
  const WriteStats& stats() const { return stats_; }
  // The file descriptor being written, for a crash handler that appends one
  // prepared frame with write(2); -1 after Close.
  int crash_fd() const { return closed_ ? -1 : sink_->fd(); }

 private:
  struct ChunkJob;
  struct Pending;

  BundleWriter(WriterOptions options, std::unique_ptr<FileSink> sink);
  absl::StatusOr<uint64_t> WriteFrame(FrameKind kind, uint32_t flags, absl::Span<const std::byte> payload,
                                      uint64_t hash);
  absl::Status WriteRecord(uint16_t kind, int64_t step, absl::Span<const std::byte> bytes, uint32_t flags);
  // A record other than blob and tensor, encoded by the calling thread.
  static Pending Encoded(const Record& record);
  absl::Status Enqueue(Pending item);
  absl::Status WriteOne(Pending& item);
  absl::Status Drain();
  absl::Status Fail(absl::Status status);

  WriterOptions options_;
  std::unique_ptr<FileSink> sink_;
  absl::Status failed_;
  bool closed_ = false;
  IndexData index_;
  absl::flat_hash_map<BlobHash, uint32_t> blob_by_hash_;
  absl::flat_hash_set<std::pair<std::string, int64_t>> names_;
  std::deque<Pending> pending_;
  size_t max_pending_chunks_;
  size_t pending_chunks_ = 0;
  std::unique_ptr<llvm::ThreadPool> pool_;
  WriteStats stats_;
};

}  // namespace moerr::formats
