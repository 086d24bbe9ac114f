// Streams an HF checkpoint's weights to disk tensor by tensor: one
// model.safetensors, or HF-style shards model-0000i-of-0000n.safetensors of
// at most a byte limit each with model.safetensors.index.json (weight_map,
// metadata.total_size). Every tensor's name, dtype and shape are given up
// front (each shard's header precedes its data); then the bytes come in that
// order, so memory holds one tensor at a time, never a shard.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/dtype.h"
#include "formats/file_sink.h"
#include "formats/safetensors.h"

namespace moerr::formats {

struct ShardingOptions {
  // false: one model.safetensors and no index. true: shards and an index
  // (even when everything fits in one shard, as HF names them).
  bool sharded = false;
  // Bytes of tensor data per shard; a shard closes before the tensor that
  // would take it past the limit (a larger tensor gets a shard of its own).
  // 0: no limit.
  uint64_t max_shard_bytes = 0;
};

class CheckpointWriter {
 public:
  // Plans the shards of `entries` (in this order) under `dir` (created);
  // `metadata` is every shard's __metadata__. Refuses existing files unless
  // `overwrite`.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(const std::string& dir,
                                                                  std::vector<TensorEntry> entries,
                                                                  const ShardingOptions& sharding,
                                                                  std::map<std::string, std::string> metadata,
                                                                  bool overwrite);
  ~CheckpointWriter();

  // The next tensor's bytes (numel x itemsize, row-major); `name` must be
  // the next entry's.
  absl::Status Write(const std::string& name, absl::Span<const std::byte> bytes);
  // After the last tensor: closes the last shard and writes the index.
  absl::Status Finish();

  // Shard file names, in order, and the shard the next tensor goes to.
  const std::vector<std::string>& shard_files() const { return files_; }
  int64_t shard_of_next() const;
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  CheckpointWriter() = default;
  absl::Status OpenShard(size_t shard);
  absl::Status CloseShard();

  std::string dir_;
  std::vector<TensorEntry> entries_;
  std::vector<uint64_t> nbytes_;       // per entry
  std::vector<size_t> shard_;          // per entry
  std::vector<size_t> shard_begin_;    // first entry of each shard, and entries_.size() last
  std::vector<std::string> files_;
  std::map<std::string, std::string> metadata_;
  ShardingOptions sharding_;
  bool overwrite_ = false;
  size_t next_ = 0;
  uint64_t total_bytes_ = 0;
  std::unique_ptr<FileSink> sink_;
};

}  // namespace moerr::formats
