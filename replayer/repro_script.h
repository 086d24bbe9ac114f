// The standalone repro of an op-level reduce (op_reduce.h): a Python script
// that needs torch alone. It loads the cut's leaves from a safetensors file
// beside it (its own reader, no `safetensors` package), calls the kept ops in
// recorded order through `torch.ops.<namespace>.<op>.<overload>` (outputs of
// random and foreign ops, which the replay takes from the record, are loaded
// too), each under the CPU autocast state it was recorded with, with grad
// mode off and the recorded thread count, and after each op checks what
// analysis::FindFirstOverflow checks: an op whose floating inputs (tensors and
// scalars) are finite and one of whose floating outputs is not raises
// AssertionError("op 3 aten::linear produces Inf from finite inputs"). It
// exits 0 when no op does.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/trace.h"

namespace moerr::replayer {

// Where the cut came from, for the script's docstring.
struct ReproSource {
  std::string bundle;           // the recording's path
  int64_t step = 0;
  size_t ops = 0;               // ops in the recorded step
  std::vector<size_t> kept;     // the recorded op index of each op of the cut
  int64_t threads = 0;          // intra-op threads it was recorded with; 0: unknown (left as it is)
  std::optional<size_t> cause;  // position in the cut of the op bisect names as the cause
};

// Writes the script to `script_path` and the values of `cut`'s leaves
// (`values`, by tensor id) to `values_path`, which the script finds by its
// file name beside itself. Returns the assertion the script raises while
// the last op's recorded failure reproduces. LibTorch may throw (schema
// lookups): callers catch at their boundary.
absl::StatusOr<std::string> WriteReproScript(const std::string& script_path, const std::string& values_path,
                                             const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                                             const ReproSource& source);

}  // namespace moerr::replayer
