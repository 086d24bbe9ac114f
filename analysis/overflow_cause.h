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
//     with the same name, module class (ModuleClass: the same module in the
//     other experts and layers) and phase, in this step and in the earlier
//     steps passed in.
// An op with no computed input is judged by its peers alone, one with no
// peers by its inputs alone; an op with neither is never named. The cause
// is the exploded op nearest the first overflow on the chain (the op that
// made the large value, not an upstream op that merely fed it); when none
// exploded, the first overflowing op is its own cause.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "analysis/first_overflow.h"
#include "formats/trace.h"

namespace moerr::analysis {

// Thresholds of the explosion criterion, in bits (factors of two). 8 bits
// (256x) is past what one healthy op does to its largest input (a matmul
// over K unit-scale terms grows by about log2(K)/2 bits) and past the spread
// between the experts or layers of a healthy model, and well under what an
// overflow needs in fp16 (~16 bits from unit scale) or fp32 (~128).
inline constexpr double kInputRiseBits = 8;
inline constexpr double kPeerRiseBits = 8;

// One op of the chain, with the output the chain passed through.
struct CauseLink {
  size_t op_index = 0;
  const formats::OpEvent* op = nullptr;  // points into the trace
  uint64_t output = 0;                   // tensor id
  double abs_max = 0;                    // the output's finite abs-max
  // log2(abs_max) minus log2 of the largest computed input's abs-max; NaN
  // when the op has no computed input.
  double input_rise_bits = 0;
  // log2(abs_max) minus the median log2 abs-max of the peers' outputs; NaN
  // when the op has no peers.
  double peer_rise_bits = 0;
  size_t peers = 0;       // how many ops the peer median is over
  bool exploded = false;  // met the criterion above
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
};

// Nullopt when the step has no overflowing output (per `options`, as in
// FindFirstOverflow). `earlier`: traces of earlier steps of the same run
// (optional; they add peers). The result points into `trace`.
std::optional<OverflowCause> FindOverflowCause(const formats::Trace& trace, const OverflowOptions& options = {},
                                               const std::vector<const formats::Trace*>& earlier = {});

}  // namespace moerr::analysis
