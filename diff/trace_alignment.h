// Alignment of two traces of the same step (DESIGN.md, "Diff"): ops are
// matched by schema, module path and phase, in order, tolerating ops present
// in only one trace (an extra cast, a missing call).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/trace.h"

namespace moerr::diff {

// One row of an alignment: op indices into trace A and trace B; -1 where the
// op has no partner.
struct AlignedPair {
  int64_t a = -1, b = -1;
};

// The key ops are matched by: name, overload, module path and phase.
uint64_t AlignmentKey(const formats::OpEvent& op);

// A shortest edit script between the key sequences (Myers' O(ND) algorithm,
// after stripping the common prefix and suffix), as pairs in execution order.
// Fails when more than `max_edits` ops would be unmatched: such traces are not
// of the same program.
absl::StatusOr<std::vector<AlignedPair>> AlignKeys(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b,
                                                   int64_t max_edits = 8192);

absl::StatusOr<std::vector<AlignedPair>> AlignTraces(const formats::Trace& a, const formats::Trace& b,
                                                     int64_t max_edits = 8192);

}  // namespace moerr::diff
