// The first overflowing op, from fingerprints alone (DESIGN.md, "Bisect"):
// the first op in execution order whose inputs (tensors and scalars) are all
// finite and one of whose outputs is not. No re-run is needed, so a stats
// bundle will do. (The headroom threshold and the precision bisect of
// DESIGN.md are not here yet.)
#pragma once

#include <optional>

#include "formats/trace.h"

namespace moerr::replayer {

struct FirstOverflow {
  size_t op_index = 0;
  const formats::OpEvent* op = nullptr;
  const formats::OpEvent* forward_op = nullptr;  // for a backward op: the forward op behind it
  uint64_t output = 0;
  formats::Fingerprint fingerprint;  // of the non-finite output
};

std::optional<FirstOverflow> FindFirstOverflow(const formats::Trace& trace);

}  // namespace moerr::replayer
