// Reads an HF checkpoint (hf_checkpoint.h: one model.safetensors, or an
// index and shards) one tensor at a time: the headers are parsed once
// (LoadHfCheckpoint, which maps the shards but touches only their headers),
// then each tensor's bytes are pread from its shard into the caller's
// buffer. Nothing stays mapped, so the process's memory holds what the
// caller keeps, however large the checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/dtype.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

struct TensorLocation {
  std::string name;
  size_t shard = 0;     // index into CheckpointReader::shard_files()
  uint64_t offset = 0;  // byte offset of its data in the shard file
  uint64_t nbytes = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class CheckpointReader {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& dir);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  const llvm::json::Object& config() const { return config_; }
  // True for an index and shards, false for one model.safetensors.
  bool sharded() const { return sharded_; }
  const std::vector<std::string>& shard_files() const { return files_; }
  const std::vector<uint64_t>& shard_sizes() const { return file_sizes_; }
  // The first shard's __metadata__.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Every tensor in file order: shards in name order, each in data order.
  const std::vector<TensorLocation>& tensors() const { return tensors_; }
  const TensorLocation* Find(const std::string& name) const;

  // Bytes [begin, begin + nbytes) of tensor `t`'s data into `dst`.
  absl::Status Read(const TensorLocation& t, uint64_t begin, uint64_t nbytes, std::byte* dst) const;
  absl::Status Read(const TensorLocation& t, std::byte* dst) const { return Read(t, 0, t.nbytes, dst); }
  // Bytes read so far.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  CheckpointReader() = default;

  std::string dir_;
  llvm::json::Object config_;
  bool sharded_ = false;
  std::vector<std::string> files_;
  std::vector<uint64_t> file_sizes_;
  std::vector<int> fds_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorLocation> tensors_;
  std::map<std::string, size_t> by_name_;
  mutable uint64_t bytes_read_ = 0;
};

}  // namespace moerr::formats
