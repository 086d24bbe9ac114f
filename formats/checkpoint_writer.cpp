#include "formats/checkpoint_writer.h"

#include <set>

#include "absl/strings/str_format.h"
#include "formats/json_file.h"
#include "llvm/Support/JSON.h"
#include "support/filesystem.h"
#include "support/status.h"

namespace moerr::formats {

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(const std::string& dir,
                                                                           std::vector<TensorEntry> entries,
                                                                           const ShardingOptions& sharding,
                                                                           std::map<std::string, std::string> metadata,
                                                                           bool overwrite) {
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->dir_ = dir;
  w->sharding_ = sharding;
  w->metadata_ = std::move(metadata);
  w->overwrite_ = overwrite;
  std::set<std::string> seen;
  uint64_t in_shard = 0;
  for (const TensorEntry& e : entries) {
    if (!seen.insert(e.name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: tensor \"%s\" given twice", dir, e.name));
    }
    MOERR_ASSIGN_OR_RETURN(const int64_t n, CheckedNumel(e.shape, ItemSize(e.dtype)));
    const uint64_t nbytes = static_cast<uint64_t>(n);
    // HF's rule: a new shard when this tensor would take a non-empty one past the limit.
    const bool split = sharding.sharded && sharding.max_shard_bytes > 0 && in_shard > 0 &&
                       in_shard + nbytes > sharding.max_shard_bytes;
    if (w->shard_begin_.empty() || split) {
      w->shard_begin_.push_back(w->nbytes_.size());
      in_shard = 0;
    }
    in_shard += nbytes;
    w->total_bytes_ += nbytes;
    w->nbytes_.push_back(nbytes);
    w->shard_.push_back(w->shard_begin_.size() - 1);
  }
  if (w->shard_begin_.empty()) w->shard_begin_.push_back(0);
  const size_t shards = w->shard_begin_.size();
  w->shard_begin_.push_back(entries.size());
  for (size_t s = 0; s < shards; ++s) {
    w->files_.push_back(sharding.sharded ? absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards)
                                         : std::string("model.safetensors"));
  }
  w->entries_ = std::move(entries);
  MOERR_RETURN_IF_ERROR(MakeDirectory(dir));
  MOERR_RETURN_IF_ERROR(w->OpenShard(0));
  return w;
}

CheckpointWriter::~CheckpointWriter() = default;

int64_t CheckpointWriter::shard_of_next() const {
  return next_ < shard_.size() ? static_cast<int64_t>(shard_[next_]) : static_cast<int64_t>(files_.size());
}

absl::Status CheckpointWriter::OpenShard(size_t shard) {
  const std::string path = dir_ + "/" + files_[shard];
  MOERR_ASSIGN_OR_RETURN(sink_, FileSink::Create(path, overwrite_));
  const size_t begin = shard_begin_[shard], count = shard_begin_[shard + 1] - begin;
  const std::string header = SafetensorsHeader(absl::MakeConstSpan(entries_).subspan(begin, count),
                                               absl::MakeConstSpan(nbytes_).subspan(begin, count), metadata_);
  return sink_->Write(absl::MakeConstSpan(reinterpret_cast<const std::byte*>(header.data()), header.size()));
}

absl::Status CheckpointWriter::CloseShard() {
  absl::Status s = sink_->Finish(/*sync=*/true);
  sink_.reset();
  return s;
}

absl::Status CheckpointWriter::Write(const std::string& name, absl::Span<const std::byte> bytes) {
  if (next_ >= entries_.size() || entries_[next_].name != name) {
    return absl::InternalError(absl::StrFormat("checkpoint writer: \"%s\" out of the planned order (expected \"%s\")",
                                               name, next_ < entries_.size() ? entries_[next_].name : "none"));
  }
  if (bytes.size() != nbytes_[next_]) {
    return absl::InternalError(absl::StrFormat("checkpoint writer: \"%s\" has %d bytes, its entry %d", name,
                                               bytes.size(), nbytes_[next_]));
  }
  if (next_ > 0 && shard_[next_] != shard_[next_ - 1]) {
    MOERR_RETURN_IF_ERROR(CloseShard());
    MOERR_RETURN_IF_ERROR(OpenShard(shard_[next_]));
  }
  ++next_;
  return Annotate(sink_->Write(bytes), absl::StrFormat("writing \"%s\"", name));
}

absl::Status CheckpointWriter::Finish() {
  if (next_ != entries_.size()) {
    return absl::InternalError(absl::StrFormat("checkpoint writer: finished after %d of %d tensors", next_,
                                               entries_.size()));
  }
  MOERR_RETURN_IF_ERROR(CloseShard());
  if (!sharding_.sharded) return absl::OkStatus();
  llvm::json::Object weight_map;
  for (size_t i = 0; i < entries_.size(); ++i) weight_map[entries_[i].name] = files_[shard_[i]];
  llvm::json::Object index{{"metadata", llvm::json::Object{{"total_size", static_cast<int64_t>(total_bytes_)}}},
                           {"weight_map", std::move(weight_map)}};
  return WriteJsonFile(dir_ + "/model.safetensors.index.json", std::move(index), overwrite_);
}

}  // namespace moerr::formats
