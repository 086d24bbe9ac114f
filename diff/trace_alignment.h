// Alignment of two traces of the same step (DESIGN.md, "Diff"): ops are
// matched by schema, module path and phase, in order, tolerating ops present
// in only one trace (an extra cast, a missing call).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/trace.h"

namespace moerr::diff {

// One row of an alignment: op indices into trace A and trace B; -1 where the
// op has no partner.
struct AlignedPair {
  int64_t a = -1, b = -1;
};

// An in-place op's name as its out-of-place form's ("aten::add_" ->
// "aten::add"; "aten::__and__" stays): autograd's engine sums a gradient
// that reaches a node twice in place only when nothing else holds the first
// addend (torch 2.x's InputBuffer), so a recorder that still holds it sees
// aten::add where a replay sees aten::add_, with the same values.
std::string_view OutOfPlaceName(std::string_view name);

// The key ops are matched by: name (its out-of-place form), overload, module
// path and phase.
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
