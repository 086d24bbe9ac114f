// JSON files: configs, indexes, reports.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

// NotFound naming the file when it cannot be read; InvalidArgument with
// LLVM's parse error (line and column) when it is not JSON.
absl::StatusOr<llvm::json::Value> ReadJsonFile(const std::string& path);

// Pretty-printed (2 spaces) with a final newline, written through a
// .partial file and a rename (FileSink), synced.
absl::Status WriteJsonFile(const std::string& path, const llvm::json::Value& value, bool overwrite);

}  // namespace moerr::formats
