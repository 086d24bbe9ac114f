// `moerr import torch FILE.pt|DIR -o RUN`: what torch.save wrote (a tensor,
// a state_dict, a checkpoint of nested dicts, lists and tuples with optimizer
// state; a directory: its .pt files in natural order) as a full bundle
// RUN/rank0.moerr with one op per tensor, in order, named by its path
// ("model.0.weight", "optimizer.state.0.exp_avg"; "stem/path" for a
// directory), so diff and bisect work on it. Numbers, strings, booleans and
// None become the annotation "imported_values" (path: value); entries it
// cannot read (a numpy array, an object of the user's class, a sparse
// tensor) are skipped and named in "imported_skipped". A damaged file is
// refused, naming the entry; nothing is left in RUN then (docs/IMPORT.md).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "importers/import_writer.h"

namespace moerr::importers {

absl::StatusOr<ImportResult> ImportTorch(const std::string& path, const std::string& run_dir,
                                         const ImportOptions& options = {});

}  // namespace moerr::importers
