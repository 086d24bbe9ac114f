// The config.json keys moerr knows, per model family, in one table
// (config_keys.cpp). Each key is
//   implemented: FromHfConfig reads it and the model follows it;
//   refused:     it changes the forward pass in a way moerr does not
//                implement; a value that leaves the forward unchanged (null,
//                false, 0, a disabled sliding window) is accepted, any other
//                is an error naming the key and its value;
//   metadata:    it does not change the forward (tokenizer ids, torch_dtype,
//                architectures, ...); ignored, listed only on request.
// A key in no row is an error too: moerr cannot tell what it would do.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "moe/moe_config.h"

namespace moerr::moe {

enum class KeyUse { kImplemented, kRefused, kMetadata };

struct ConfigKey {
  std::string name;
  KeyUse use;
  std::string what;  // for refused keys, the feature moerr lacks
};

// The rows of `family`'s table, in table order.
std::vector<ConfigKey> KnownConfigKeys(Family family);

// Checks every key of `json` against `family`'s table. Returns the metadata
// keys present (sorted), or an error listing every refused key whose value
// changes the forward and every unknown key, each with its value.
absl::StatusOr<std::vector<std::string>> CheckConfigKeys(const llvm::json::Object& json, Family family);

}  // namespace moerr::moe
