// `moerr import torch FILE.pt|DIR -o RUN`: tensors saved with torch.save (a
// dict of names to tensors, nested dicts and lists flattened with ".", or a
// single tensor; a directory: its .pt files in natural order) as a full
// bundle RUN/rank0.moerr with one op per tensor, in order, named by its key
// ("stem/key" for a directory), so diff and bisect work on it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "importers/msprobe_import.h"

namespace moerr::importers {

absl::StatusOr<ImportResult> ImportTorch(const std::string& path, const std::string& run_dir,
                                         const ImportOptions& options = {});

}  // namespace moerr::importers
