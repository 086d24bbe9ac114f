#include "formats/hf_checkpoint.h"

#include <sys/stat.h>

#include "absl/strings/str_format.h"
#include "formats/json_file.h"
#include "support/filesystem.h"
#include "support/status.h"

namespace moerr::formats {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<HfCheckpoint> LoadHfCheckpoint(const std::string& dir) {
  HfCheckpoint out;
  MOERR_ASSIGN_OR_RETURN(llvm::json::Value config, ReadJsonFile(dir + "/config.json"));
  if (config.getAsObject() == nullptr) return absl::InvalidArgumentError(dir + "/config.json is not a JSON object");
  out.config = std::move(*config.getAsObject());

  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> shard_of;  // tensor -> shard file
  std::vector<std::string> shard_names;
  if (Exists(index_path)) {
    MOERR_ASSIGN_OR_RETURN(llvm::json::Value index, ReadJsonFile(index_path));
    const llvm::json::Object* weight_map = index.getAsObject() ? index.getAsObject()->getObject("weight_map") : nullptr;
    if (weight_map == nullptr) return absl::InvalidArgumentError(index_path + ": no weight_map object");
    for (const auto& [name, file] : *weight_map) {
      auto f = file.getAsString();
      if (!f || f->empty() || f->contains('/') || *f == "." || *f == "..") {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: shard of \"%s\" must be a plain file name in the checkpoint directory", index_path,
                            name.str()));
      }
      shard_of[name.str()] = f->str();
      if (std::find(shard_names.begin(), shard_names.end(), f->str()) == shard_names.end()) {
        shard_names.push_back(f->str());
      }
    }
    std::sort(shard_names.begin(), shard_names.end());
  } else if (Exists(single)) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrFormat("%s has neither model.safetensors nor model.safetensors.index.json", dir));
  }
  for (const std::string& shard : shard_names) {
    MOERR_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(dir + "/" + shard));
    for (const auto& [name, view] : file.tensors) {
      if (!shard_of.empty()) {
        auto it = shard_of.find(name);
        if (it == shard_of.end() || it->second != shard) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s/%s holds \"%s\", which the index places elsewhere", dir, shard, name));
        }
      }
      if (!out.tensors.emplace(name, view).second) {
        return absl::InvalidArgumentError(absl::StrFormat("%s: tensor \"%s\" is in two shards", dir, name));
      }
    }
    out.shards.push_back(std::move(file));
  }
  for (const auto& [name, shard] : shard_of) {
    if (!out.tensors.count(name)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: the index lists \"%s\" in %s, which lacks it", dir, name, shard));
    }
  }
  return out;
}

absl::Status SaveHfCheckpoint(const std::string& dir, const llvm::json::Object& config,
                              const std::vector<std::pair<std::string, TensorView>>& tensors, bool overwrite) {
  MOERR_RETURN_IF_ERROR(MakeDirectory(dir));
  MOERR_RETURN_IF_ERROR(WriteJsonFile(dir + "/config.json", llvm::json::Object(config), overwrite));
  return WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}, overwrite);
}

absl::Status SaveHfCheckpoint(const std::string& dir, const llvm::json::Object& config,
                              const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const ShardingOptions& sharding, bool overwrite) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, view] : tensors) entries.push_back(TensorEntry{name, view.dtype, view.shape});
  MOERR_ASSIGN_OR_RETURN(auto writer,
                         CheckpointWriter::Create(dir, std::move(entries), sharding, {{"format", "pt"}}, overwrite));
  MOERR_RETURN_IF_ERROR(WriteJsonFile(dir + "/config.json", llvm::json::Object(config), overwrite));
  std::vector<std::byte> scratch;
  for (const auto& [name, view] : tensors) {
    MOERR_ASSIGN_OR_RETURN(const int64_t nbytes, CheckedNumel(view.shape, ItemSize(view.dtype)));
    const std::byte* bytes = view.data;
    if (!view.IsContiguous()) {
      scratch.resize(static_cast<size_t>(nbytes));
      CopyToContiguous(view, scratch.data());
      bytes = scratch.data();
    }
    MOERR_RETURN_IF_ERROR(writer->Write(name, absl::MakeConstSpan(bytes, static_cast<size_t>(nbytes))));
  }
  return writer->Finish();
}

}  // namespace moerr::formats
