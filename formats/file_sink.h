// The crash-safe file underneath a bundle (and other files moerr writes): appends to PATH.partial and, at
// Commit, adds the index frame and footer, syncs and renames to PATH. Shared by
// the writer and by salvage, which copies a valid prefix and commits a rebuilt
// index after it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/frame.h"

struct iovec;

namespace moerr::formats {

class FileSink {
 public:
  // Creates PATH.partial. Refuses when PATH exists or a stale PATH.partial
  // (a crashed writer's, salvageable) is there, unless `overwrite`.
  static absl::StatusOr<std::unique_ptr<FileSink>> Create(const std::string& path, bool overwrite);
  // Without Commit, PATH.partial stays as it is.
  ~FileSink();

  absl::Status Write(absl::Span<const std::byte> bytes);
  // Appends a frame (header, payload, padding); returns its payload offset.
  absl::StatusOr<uint64_t> WriteFrame(FrameKind kind, uint32_t flags, absl::Span<const std::byte> payload,
                                      uint64_t hash);
  // Index frame and footer, then Finish.
  absl::Status Commit(absl::Span<const std::byte> index, bool sync);
  // Closes, then renames PATH.partial to PATH; when `sync`, fsyncs the file
  // before and its directory after. For files that are not bundles too.
  absl::Status Finish(bool sync);

  uint64_t offset() const { return offset_; }
  // For a crash handler's async-signal-safe append of a prepared frame.
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::string partial_path() const { return path_ + ".partial"; }

 private:
  FileSink(std::string path, bool overwrite, int fd) : path_(std::move(path)), overwrite_(overwrite), fd_(fd) {}
  absl::Status WriteV(::iovec* iov, int count);

  std::string path_;
  bool overwrite_;
  int fd_;
  uint64_t offset_ = 0;
};

}  // namespace moerr::formats
