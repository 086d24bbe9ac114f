// Directories the tools write their outputs into.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace moerr {

// Creates directory `path` (mode 0755) unless it already is one; its parent
// must exist. Unavailable, naming the path and the reason, when it cannot be
// created or something other than a directory has the name.
absl::Status MakeDirectory(const std::string& path);

}  // namespace moerr
