// Which formats a recorded step holds its values in: what the lint checks
// and the report ask before they call an fp16 or bf16 range a risk or
// propose precision bisect.
#pragma once

#include "formats/trace.h"

namespace moerr::analysis {

// fp16 or bf16.
inline bool Is16Bit(formats::DType d) { return d == formats::DType::kF16 || d == formats::DType::kBF16; }

// Whether any tensor of `trace` (op inputs and outputs, step inputs) is held
// in `dtype`.
inline bool HoldsDType(const formats::Trace& trace, formats::DType dtype) {
  for (const formats::TensorMeta& m : trace.tensors) {
    if (m.dtype == dtype) return true;
  }
  return false;
}

// Whether any is held in fp16 or bf16: then upcasting modules may remove
// an overflow, and precision bisect says which.
inline bool Holds16Bit(const formats::Trace& trace) {
  for (const formats::TensorMeta& m : trace.tensors) {
    if (Is16Bit(m.dtype)) return true;
  }
  return false;
}

}  // namespace moerr::analysis
