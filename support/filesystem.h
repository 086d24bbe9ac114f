// Directories and files the tools write their outputs into, and checks on
// the files a command is given.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moerr {

// Creates directory `path` (mode 0755) unless it already is one; its parent
// must exist. Unavailable, naming the path and the reason, when it cannot be
// created or something other than a directory has the name.
absl::Status MakeDirectory(const std::string& path);

// InvalidArgument when the output `path` is one of the files `inputs` name
// (the same file by any name): writing it would destroy what a command
// reads, --force or not.
absl::Status CheckNotAnInput(const std::string& path, const std::vector<std::string>& inputs);

// InvalidArgument when two of `inputs` are the same file (by any name),
// naming both: a file given twice is a slip, and the command's output
// would list it twice as one of its sources.
absl::Status CheckDistinctInputs(const std::vector<std::string>& inputs);

}  // namespace moerr
