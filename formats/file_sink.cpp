#include "formats/file_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"

namespace moerr::formats {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrFormat("%s %s: %s", what, path, std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileSink>> FileSink::Create(const std::string& path, bool overwrite) {
  struct stat st;
  if (!overwrite && ::stat(path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrFormat("%s exists; pass --force to overwrite it", path));
  }
  const std::string partial = path + ".partial";
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  const int fd = ::open(partial.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "%s exists: an earlier writer crashed or is still running; salvage it (`moerr salvage`), remove it, "
          "or pass --force",
          partial));
    }
    return ErrnoError("cannot create", partial);
  }
  return std::unique_ptr<FileSink>(new FileSink(path, overwrite, fd));
}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileSink::WriteV(iovec* iov, int count) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  size_t done = 0;
  int first = 0;
  while (done < total) {
    const ssize_t n = ::writev(fd_, iov + first, count - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", partial_path());
    }
    done += n;
    size_t left = n;  // advance the iovecs past what was written
    while (first < count && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  offset_ += total;
  return absl::OkStatus();
}

absl::Status FileSink::Write(absl::Span<const std::byte> bytes) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  return WriteV(&iov, 1);
}

absl::StatusOr<uint64_t> FileSink::WriteFrame(FrameKind kind, uint32_t flags, absl::Span<const std::byte> payload,
                                              uint64_t hash) {
  const auto header = EncodeFrameHeader(FrameHeader{static_cast<uint32_t>(kind), flags, payload.size(), hash});
  static constexpr std::byte kZeros[8] = {};
  iovec iov[3] = {{const_cast<std::byte*>(header.data()), header.size()},
                  {const_cast<std::byte*>(payload.data()), payload.size()},
                  {const_cast<std::byte*>(kZeros), PaddedLength(payload.size()) - payload.size()}};
  const uint64_t payload_offset = offset_ + kFrameHeaderSize;
  if (absl::Status s = WriteV(iov, 3); !s.ok()) return s;
  return payload_offset;
}

absl::Status FileSink::Commit(absl::Span<const std::byte> index, bool sync) {
  const uint64_t hash = FrameHash(static_cast<uint32_t>(FrameKind::kIndex), 0, index);
  absl::StatusOr<uint64_t> at = WriteFrame(FrameKind::kIndex, 0, index, hash);
  if (!at.ok()) return at.status();
  const auto footer = EncodeFooter(Footer{*at, index.size(), hash});
  if (absl::Status s = Write(footer); !s.ok()) return s;
  return Finish(sync);
}

absl::Status FileSink::Finish(bool sync) {
  if (sync && ::fsync(fd_) != 0) return ErrnoError("cannot sync", partial_path());
  ::close(fd_);
  fd_ = -1;
  const std::string partial = partial_path();
  const int rc = overwrite_ ? ::rename(partial.c_str(), path_.c_str())
                            : ::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrFormat("cannot rename %s to %s: %s (the bundle is kept as %s)", partial,
                                               path_, std::strerror(errno), partial));
  }
  if (sync) {
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return absl::OkStatus();
}

}  // namespace moerr::formats
