// The parts of program replay that apply a precision policy's rule
// (precision_policy.h) to the values an op reads and produces; used by
// program_replay.cpp alone.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>

#include <cstdint>

#include "formats/trace.h"
#include "replayer/precision_policy.h"

namespace moerr::replayer {

// A floating input as the op should see it under `rule` (or none): upcast
// under an upcast rule, otherwise in the dtype it was recorded with (`meta`;
// a value leaving an upcast region is rounded back here).
at::Tensor CoerceInput(const at::Tensor& t, const formats::TensorMeta* meta, const PolicyRule* rule);

// Rounds a floating output as a lower-precision device would store it
// (`action`, a rounding rule's); fp16 exactly as the reference model's fp16
// emulation does.
at::Tensor RoundOutput(const at::Tensor& t, PolicyRule::Action action);

// An int argument as the op should see it under `rule` (or none): where the
// schema says it is a ScalarType, an upcast op converts to the upcast type
// where it would have converted to a lower-precision one (.to(half) under
// fp16 emulation). Any other int is `value` unchanged.
int64_t CoerceIntArgument(int64_t value, const c10::Argument* schema_arg, const PolicyRule* rule);

}  // namespace moerr::replayer
