// `moerr bisect` of one bundle's step from its fingerprints alone: the first
// overflowing op and its cause (analysis/overflow_cause.h), as text or JSON.
// The world bisect (world/world_bisect.h) prints its origin rank's cause
// with the same functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "analysis/first_overflow.h"
#include "analysis/overflow_cause.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"
#include "support/exit_code.h"

namespace moerr::analysis {

// The cause and the chain from it to the first overflow, as text; `ops` is
// the step's op count. A long chain shows its first and last ops.
// `ends_in_overflow` false: the chain ends at the op whose output a rank
// sent on (a walk across ranks, cross_rank_walk.h), not at an overflow.
void PrintCause(const OverflowCause& found, size_t ops, int64_t step, bool ends_in_overflow = true);
// The first overflow as text: its output and the headroom trend before it.
void PrintFirstOverflow(const FirstOverflow& found, size_t ops, int64_t step);
// The JSON of one step's result: the first overflow's keys (those of
// FindFirstOverflow), then "cause" and "chain".
llvm::json::Object CauseJson(const OverflowCause& found, int64_t step);

// msprobe's own overflow_check beside bisect's first overflow (op
// `first_op` of `step`, on `rank`) of a bundle imported from an msprobe dump
// with its result (the "msprobe_overflow_check" annotation,
// docs/IMPORT.md): {"entry": msprobe's first anomaly on that rank or null,
// "moerr_entry": the dump entry of bisect's, "agrees"}. Nullopt when the
// bundle has no such result.
std::optional<llvm::json::Object> OverflowCheckCrossCheck(const formats::BundleReader& reader, int64_t step,
                                                          int64_t rank, size_t first_op);
// The cross-check as one line of text.
void PrintOverflowCheck(const llvm::json::Object& check, int64_t rank);

// The default bisect of `step` of `reader` (its trace `trace`): the first
// overflow and its cause, printed, or appended to `results` when `json`. The
// step before it, when the bundle holds it complete, adds peers.
// kExitFinding when an op overflows, kExitOk when none does.
ExitOr RunCauseBisect(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                      const OverflowOptions& options, bool json, llvm::json::Array& results);

}  // namespace moerr::analysis
