#include "formats/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "formats/hf_checkpoint.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/status.h"

namespace moerr::formats {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& dir) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = dir;
  // Parses config.json, the index and every shard's header; the maps are
  // dropped at the end of this scope, having touched only header pages.
  MOERR_ASSIGN_OR_RETURN(HfCheckpoint ckpt, LoadHfCheckpoint(dir));
  r->config_ = std::move(ckpt.config);
  r->sharded_ = ::access((dir + "/model.safetensors.index.json").c_str(), F_OK) == 0;
  for (size_t s = 0; s < ckpt.shards.size(); ++s) {
    const SafetensorsFile& file = ckpt.shards[s];
    const std::string path = file.buffer->getBufferIdentifier().str();
    const size_t slash = path.rfind('/');
    r->files_.push_back(slash == std::string::npos ? path : path.substr(slash + 1));
    r->file_sizes_.push_back(file.buffer->getBufferSize());
    if (s == 0) r->metadata_ = file.metadata;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", path, std::strerror(errno)));
    r->fds_.push_back(fd);
    const auto* start = reinterpret_cast<const std::byte*>(file.buffer->getBufferStart());
    for (const auto& [name, view] : file.tensors) {
      TensorLocation t;
      t.name = name;
      t.shard = s;
      t.offset = static_cast<uint64_t>(view.data - start);
      t.dtype = view.dtype;
      t.shape = view.shape;
      t.nbytes = static_cast<uint64_t>(*CheckedNumel(view.shape, ItemSize(view.dtype)));  // checked by the parser
      r->by_name_[name] = r->tensors_.size();
      r->tensors_.push_back(std::move(t));
    }
  }
  return r;
}

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_) ::close(fd);
}

const TensorLocation* CheckpointReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status CheckpointReader::Read(const TensorLocation& t, uint64_t begin, uint64_t nbytes, std::byte* dst) const {
  const std::string where = absl::StrFormat("%s/%s, tensor \"%s\"", dir_, files_[t.shard], t.name);
  if (begin > t.nbytes || nbytes > t.nbytes - begin) {
    return absl::InternalError(absl::StrFormat("%s: bytes [%d, +%d) are outside its %d", where, begin, nbytes, t.nbytes));
  }
  uint64_t done = 0;
  while (done < nbytes) {
    const ssize_t n = ::pread(fds_[t.shard], dst + done, nbytes - done, static_cast<off_t>(t.offset + begin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrFormat("%s: read failed: %s", where, std::strerror(errno)));
    if (n == 0) return absl::DataLossError(absl::StrFormat("%s: the file ends early (was it truncated?)", where));
    done += static_cast<uint64_t>(n);
  }
  bytes_read_ += nbytes;
  return absl::OkStatus();
}

}  // namespace moerr::formats
