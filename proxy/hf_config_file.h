// A transformers config.json as the model `moerr proxy-eval --hf-config FILE`
// starts from instead of a preset: read, built by moe::FromHfConfig (moerr's
// strict reading: a key that would change the forward pass and that moerr
// does not implement is refused), and checked against the task it is warmed
// up on.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "moe/moe_config.h"

namespace moerr::proxy {

struct HfConfigFile {
  std::string path;
  moe::MoeConfig config;
  // The first 12 hex digits of the SHA-256 of the file's bytes: what a cache
  // of a model made from the file is keyed by (another file, or the same
  // file edited, never matches).
  std::string digest;
};

// Reads `path`. InvalidArgument or NotFound, each naming the file: unreadable,
// not JSON or not a JSON object, a config moerr refuses (FromHfConfig's
// message), or a vocab_size under `min_vocab` (the task's token ids, which the
// embedding must hold; both numbers named).
absl::StatusOr<HfConfigFile> ReadHfConfigFile(const std::string& path, int64_t min_vocab);

}  // namespace moerr::proxy
