// Rounding told from a bug in a diff of two recordings of a step (docs/
// REPLAY.md, "Introduced error"). Error accumulates along the graph, so the
// observed difference of two outputs (trace_diff.h) grows op after op and no
// fixed threshold separates a lower precision from a wrong kernel. Each
// matched op is judged instead on the error it introduces itself:
//
//   - full recordings: each side's recorded outputs against the op's fp64
//     run on that side's own recorded inputs (isolated replay,
//     replayer/introduced_error.h). The budget of a side is kBudgetMultiple
//     times the error of this machine's run of the op in the same dtypes
//     (the dtype's rounding on these inputs), and at least half a unit in
//     the last place of the dtype;
//   - statistics (fingerprints only, imported dumps): an estimate, the
//     output's observed difference less the largest one among its inputs,
//     against the threshold of the lowest precision of the two steps (or
//     kBudgetMultiple - 1 times the inherited difference, if larger).
//
// The inherited error of an op is the largest relative L2 difference among
// its floating inputs, B against A: what arrived, not what it added; +inf
// when an integer or boolean input differs (indices a routing choice moved). Two
// more things the step's own numbers cannot explain are differences too:
// the same op called with other arguments (a scalar, an option; unless an
// .item() of values that differ came before, whose Python number the
// arguments may be computed from), and a run
// of ops where the two programs call different ones (gelu for silu). Casts
// (.to, .detach) one side adds are precision plumbing, not a difference.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "diff/trace_diff.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"

namespace moerr::diff {

// An op's floating output against the op's fp64 run on the same recorded
// inputs. Both errors are relative L2, +inf where an output holds a NaN or
// an Inf that the fp64 run does not.
struct ExactRunError {
  size_t op_index = 0;
  size_t slot = 0;  // position among the op's outputs
  formats::DType dtype = formats::DType::kF32;
  double recorded = 0;  // the recorded output: what the op introduced where it ran
  double replayed = 0;  // this machine's run in the recorded dtypes: the dtype's rounding
};

// A side's introduced error may be this many times its rounding on the
// same inputs: correct kernels of other devices accumulate in other orders.
inline constexpr double kBudgetMultiple = 4;

// One side of a matched op.
struct IntroducedSide {
  bool known = false;     // measured, or (estimated) estimated
  size_t slot = 0;        // the output judged: the one furthest past its budget
  formats::DType dtype = formats::DType::kF32;
  double introduced = 0;  // relative L2
  double rounding = 0;    // this machine's run in the same dtypes (0 when estimated)
  double budget = 0;
  bool Beyond() const { return known && introduced > budget; }
};

struct PrecisionOp {
  size_t pair = 0;      // index into the observed DiffReport's ops
  int64_t a = -1, b = -1;
  double observed = 0;  // the observed report's error of the op
  double inherited = 0; // largest relative L2 difference among its inputs (+inf: NaN, Inf, shapes or integers differ)
  IntroducedSide sides[2];  // A, B
  std::string arguments;    // how the two calls differ, beyond dtypes and devices ("" when alike)
  // An .item() of values that differ came before (`item_pair`, an index into
  // the observed report's ops): the arguments may be Python numbers
  // computed from it (a clip coefficient, a loss scale), not constants.
  std::optional<size_t> item_pair;
  bool Beyond() const { return sides[0].Beyond() || sides[1].Beyond() || (!arguments.empty() && !item_pair); }
};

// A run of unmatched ops where the programs call different ops.
struct ProgramDifference {
  size_t pair = 0;  // index into the observed DiffReport's ops of the run's first op
  std::vector<int64_t> only_a, only_b;  // op indices, casts left out
};

struct PrecisionDiff {
  DiffReport observed;
  bool estimated = false;          // no side measured: introduced error estimated from fingerprints
  std::string estimated_because;   // why a side could not be measured ("" when not estimated or not asked)
  std::vector<PrecisionOp> ops;    // matched ops with floating outputs, in alignment order
  std::vector<ProgramDifference> programs;
  // The first difference in alignment order: an op past its budget or
  // called otherwise (index into `ops`), or a program difference (index
  // into `programs`); neither when the differences are within rounding.
  std::optional<size_t> first_op, first_program;
  std::optional<size_t> largest;   // into `ops`: the largest gap between the sides' introduced errors
  size_t measured_a = 0, measured_b = 0;  // ops measured on each side
  bool Found() const { return first_op || first_program; }
  // Whether the first difference is the program one.
  bool ProgramFirst() const {
    return first_program && (!first_op || programs[*first_program].pair < ops[*first_op].pair);
  }
};

// How two matched calls differ beyond the dtypes and devices a precision
// changes ("argument 1 (other): 1 vs 1.01"), or "".
using CallDifference = std::function<std::string(const formats::OpEvent& a, const formats::OpEvent& b)>;

// Judges `observed` (DiffTraces of the same traces and readers). `exact_a`
// and `exact_b` are each side's measurements (ReplayReport::introduced), or
// empty for a side not measured: with either empty, introduced error is
// estimated from fingerprints. `thresholds` serve the estimate.
absl::StatusOr<PrecisionDiff> JudgePrecision(const formats::BundleReader& reader_a, const formats::Trace& a,
                                             int64_t step_a, const formats::BundleReader& reader_b,
                                             const formats::Trace& b, int64_t step_b, DiffReport observed,
                                             const std::vector<ExactRunError>& exact_a,
                                             const std::vector<ExactRunError>& exact_b,
                                             const CallDifference& call_difference, const DiffOptions& options);

// Whether `name` only casts or aliases a value (aten::to, aten::detach, ...):
// an op one side adds for a precision.
bool IsCast(const std::string& name);

}  // namespace moerr::diff
