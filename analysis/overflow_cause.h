// The cause of an overflow, from fingerprints alone (docs/REPLAY.md,
// "Bisect"). The first non-finite output (FindFirstOverflow) is often far
// from where the value went wrong: an fp32 expert whose output reaches 5e36
// is still finite, and the first Inf or NaN appears later, in a norm that
// squares it. FindOverflowCause walks back from the first non-finite op
// through its producers and names the op whose output magnitude exploded.
//
// The walk (the chain): from the first overflowing op, step to the producer
// of its largest floating input (by abs-max); repeat until a step input
// (a tensor no recorded op of the step produced: parameters, the batch,
// optimizer state, values first seen in backward). Producers link backward
// ops to the forward values they saved, so a backward overflow walks into
// forward when the large value came from there.
//
// An op on the chain exploded when its output's log2 abs-max (its magnitude
// in bits; a rise of N bits is a headroom loss of N bits in any format)
//   * rises at least kInputRiseBits above its largest computed input (a
//     floating input some op of the step produced; views and casts of step
//     inputs count as step inputs, so a linear layer with huge weights is
//     judged against its activation input), and
//   * stands at least kPeerRiseBits above the median of its peers: the ops
//     with the same name, module class (formats::ModuleClass: the same module in the
//     other experts and layers) and phase, in this step and in the earlier
//     steps passed in. An op without peers is judged by its inputs alone.
// An op with no computed input (a view or cast of a weight, an op on the
// batch alone) is named only when its output rises kLoneRiseBits above its
// largest input, step inputs included, and it has no peers (a one-off
// in-place rescale of a weight, `weight.mul_(1e38)`, +126 bits); or when it
// stands kLoneRiseBits above its peers and above its largest input (in an
// imported dump, a linear whose activation came through a call the dump
// does not hold; a view or gather of a large weight never grows it). The cause is the exploded op nearest the
// first overflow on the chain (the op that made the large value, not the
// ops after it that only carried it on); when none exploded, the first
// overflowing op is its own cause. An exploded scope op (an imported module
// boundary, OpEvent::scope) made nothing itself: the cause is then the
// first op inside it that exploded, put before it on the chain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "analysis/first_overflow.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"

namespace moerr::analysis {

// Thresholds of the explosion criterion, in bits (factors of two). On
// healthy steps of the reference model (tiny and small presets; fp32, bf16,
// fp16 emulation) no op reaches 12 on both: the largest rises are 16 bits
// over the inputs (the fp16 loss-scale multiply, 11 over its peers) and 15
// over the peers (by ops that rose less than 12 over their inputs); at 8 on
// both, one to three ops of each step would. The expert-overflow fault's expert
// reaches 17 to 19 on both, an fp32 expert scaled by 1e37 about 120. An
// overflow needs ~16 bits from unit scale in fp16 and ~128 in fp32.
inline constexpr double kInputRiseBits = 12;
inline constexpr double kPeerRiseBits = 12;
// The margin of a lone op (no peers, no computed input), judged on its
// inputs alone: twice the others, past a 2^16 loss scale and any healthy
// rescale, far below a value pushed to overflow from unit scale in fp32.
inline constexpr double kLoneRiseBits = 24;

// One op of the chain, with the output the chain passed through.
struct CauseLink {
  size_t op_index = 0;
  const formats::OpEvent* op = nullptr;  // points into the trace
  uint64_t output = 0;                   // tensor id
  double abs_max = 0;                    // the output's finite abs-max
  // log2(abs_max) minus log2 of the largest computed input's abs-max; NaN
  // when the op has no computed input (then never named, unless it is a
  // lone op: against its largest input of any kind, kLoneRiseBits).
  double input_rise_bits = 0;
  // log2(abs_max) minus the median log2 abs-max of the peers' outputs; NaN
  // when the op has no peers.
  double peer_rise_bits = 0;
  size_t peers = 0;       // how many ops the peer median is over
  bool exploded = false;  // met the criterion above
  // The largest abs-max of its inputs that no op of the step computed
  // (parameters, the batch; in an imported dump also values made by calls
  // the dump does not hold); 0 when none.
  double outside_abs_max = 0;
};

// A link of the chain that an importer matched without certainty
// (importers/dataflow_index.h): op `consumer` reads the output of op
// `producer` because their values' largest magnitudes agree ("extreme"), or
// several ops output values with equal statistics ("ambiguous": `candidates`,
// op indices, the chosen one last).
struct UncertainLink {
  size_t producer = 0, consumer = 0;
  std::string how;
  std::vector<size_t> candidates;
};

struct OverflowCause {
  FirstOverflow first;  // the first overflowing op (what FindFirstOverflow returns)
  // The cause: an exploded op of the chain, or the first overflowing op
  // itself when no op before it exploded (`found_explosion` false).
  CauseLink cause;
  bool found_explosion = false;
  // From the cause to the first overflowing op, both included, in execution
  // order; chain.front() is the cause, chain.back() the first overflow.
  std::vector<CauseLink> chain;
  // The links of the chain an import matched inexactly (AddUncertainLinks).
  std::vector<UncertainLink> uncertain;
};

// Nullopt when the step has no overflowing output (per `options`, as in
// FindFirstOverflow). `earlier`: traces of earlier steps of the same run
// (optional; they add peers). The result points into `trace`.
std::optional<OverflowCause> FindOverflowCause(const formats::Trace& trace, const OverflowOptions& options = {},
                                               const std::vector<const formats::Trace*>& earlier = {});

// The same walk from op `op_index`'s output `output`, which need not
// overflow: the values a rank sent in a collective that carried them to
// another rank (analysis/cross_rank_walk.h). `first` describes that op and
// output; the op itself is judged too and is the cause when it exploded.
// Nullopt when the trace does not hold `output`.
std::optional<OverflowCause> FindCauseOf(const formats::Trace& trace, size_t op_index, uint64_t output,
                                         const std::vector<const formats::Trace*>& earlier = {});

// Fills found.uncertain from an imported step's "dataflow" (its
// imported_step annotation, docs/IMPORT.md): {"uncertain": [{"op": seq,
// "tensor": id, "how", "candidates": [seqs]}]}. A recording has none.
void AddUncertainLinks(const llvm::json::Value& imported_step, const formats::Trace& trace, OverflowCause& found);

}  // namespace moerr::analysis
