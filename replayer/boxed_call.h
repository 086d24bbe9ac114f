// A recorded op called through the dispatcher on boxed arguments, its
// outputs listed the way the recorder lists an op's outputs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "absl/status/statusor.h"

namespace moerr::replayer {

// Calls `handle` on `stack` (consumed) and returns its outputs flattened:
// each returned tensor, and each element of a returned tensor list, in
// order; a returned non-tensor keeps its position as an undefined tensor.
// An op that returns nothing (an in-place `_foreach_*_`) has the tensors it
// writes as its outputs, in argument order. A LibTorch exception is an
// error.
absl::StatusOr<std::vector<at::Tensor>> CallBoxed(const c10::OperatorHandle& handle, std::vector<c10::IValue> stack);

// `v` with each of its tensors (a tensor, or a list's) copied.
c10::IValue CopyTensors(const c10::IValue& v);

}  // namespace moerr::replayer
