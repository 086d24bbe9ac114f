// Recorded ops as Python source, for the standalone repros of an op-level
// reduce (repro_script.h): an op's arguments as the expressions torch.ops
// takes, the cut's values as the script loads them. The scripts name a
// tensor of the cut `v[<id>]` and a loaded value `leaf("<leaf name>")`.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/core/function_schema.h>

#include "absl/status/statusor.h"
#include "formats/trace.h"

namespace moerr::replayer {

// `s` as a Python string literal.
std::string PyString(const std::string& s);

// A Python float literal that stays a float ("1.0", not "1": a Scalar's type
// decides type promotion); "float('inf')" and the like where it is not finite.
std::string PyFloat(double f);

// `leaf("NAME")` of a cut-free value, with its recorded strides when the op
// saw a dense non-contiguous layout (the replay restores those too).
std::string PyLeaf(const formats::TensorMeta& meta);

// An op's arguments as Python expressions: positional, keyword-only (as
// `"name": expr` entries of a dict) and those the op writes in place.
struct PyArgs {
  std::vector<std::string> positional, keywords, written;
};

// The arguments of `op` (recorded op `recorded`, named in errors). `schema`
// may be null (an op this LibTorch lacks): ints stay ints, and every
// argument is positional.
absl::StatusOr<PyArgs> PyArgsOf(const formats::OpEvent& op, size_t recorded, const std::vector<c10::Argument>* schema);

// "torch.ops.aten.linear.default": how a script calls `op`.
std::string TorchOp(const formats::OpEvent& op);

// The dtype of the CPU autocast state `op` ran under ("torch.bfloat16"), or
// "None" when autocast was off.
absl::StatusOr<std::string> AutocastDType(const formats::OpEvent& op);

// Op `index` of a cut (recorded op `recorded`): a comment naming it, and its
// arguments as `a` (positional) and `kw` (keyword-only).
std::string ArgLines(const formats::OpEvent& op, size_t index, size_t recorded, const PyArgs& args);

}  // namespace moerr::replayer
