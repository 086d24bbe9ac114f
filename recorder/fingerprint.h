// Tensor fingerprints: one pass over the values (min, max, mean, abs-max, L2,
// NaN / +Inf / -Inf counts, counts beyond the fp16 and bf16 finite range)
// plus XXH3-64 of the contiguous bytes. Computed without dispatching ATen ops
// where the tensor is contiguous, so it never re-enters the recorder.
#pragma once

#include <ATen/core/Tensor.h>

#include "formats/trace.h"

namespace moerr::recorder {

formats::Fingerprint ComputeFingerprint(const at::Tensor& t);

}  // namespace moerr::recorder
