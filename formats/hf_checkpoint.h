// HF-layout checkpoints: a directory with config.json and either
// model.safetensors or model.safetensors.index.json plus its shards.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/checkpoint_writer.h"
#include "formats/safetensors.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

struct HfCheckpoint {
  llvm::json::Object config;
  std::vector<SafetensorsFile> shards;      // own the mapped bytes
  std::map<std::string, TensorView> tensors;  // by parameter name, into shards
};

// Loads config.json and the weights. A sharded checkpoint's shard names must
// be plain file names inside `dir`, and every tensor must be in exactly one
// shard, as the index says.
absl::StatusOr<HfCheckpoint> LoadHfCheckpoint(const std::string& dir);

// Writes `dir`/config.json and `dir`/model.safetensors (creates `dir`).
absl::Status SaveHfCheckpoint(const std::string& dir, const llvm::json::Object& config,
                              const std::vector<std::pair<std::string, TensorView>>& tensors, bool overwrite);
// The same with `sharding` (checkpoint_writer.h): HF-named shards of at most
// max_shard_bytes each and model.safetensors.index.json when sharded.
absl::Status SaveHfCheckpoint(const std::string& dir, const llvm::json::Object& config,
                              const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const ShardingOptions& sharding, bool overwrite);

}  // namespace moerr::formats
