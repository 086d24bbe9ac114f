// The module paths the recorder stores with each op, in the reference
// model's and Hugging Face's layout: "model.layers.3.mlp.experts.5.down_proj".
// One parser for every component that reasons about layers and experts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace moerr::formats {

struct ModulePath {
  std::optional<int64_t> layer;   // L of "model.layers.L..."
  std::optional<int64_t> expert;  // E of "model.layers.L.<block>.experts.E..."; set only with `layer`
  std::string module_class;       // the path without its indices (ModuleClass)
};

ModulePath ParseModulePath(absl::string_view module);

// The (layer, expert) a module path names: "model.layers.L.<block>.experts.E...".
std::optional<std::pair<int64_t, int64_t>> ExpertOf(absl::string_view module);

// A module path without its indices: "model.layers.0.mlp.experts.3" ->
// "model.layers.mlp.experts" ("layer 1" -> "layer"). Two failures in the
// same module class are the same kind of failure in a smaller model.
std::string ModuleClass(absl::string_view module);

}  // namespace moerr::formats
