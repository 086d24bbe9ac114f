// Tensor shrinking, the op-level reduce's last stage (op_reduce.h): the
// values cut free to feed the kept ops lose rows (dim 0: rows of a batch, an
// expert's routed tokens), tokens (dim 1 of a [batch, tokens, hidden]
// activation) or any other dimension, while the cut still fails the same way.
// Which ops allow it is not decided here but tried: a candidate whose replay
// raises (a recorded shape argument, an index past the new end) or no longer
// fails is dropped.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>

#include "formats/trace.h"

namespace moerr::replayer {

// A cut (step_cut.h) and the values of all its leaves, by tensor id; each
// leaf's shape, strides and fingerprint are those of its value.
struct ShrunkCut {
  formats::Trace cut;
  std::map<uint64_t, at::Tensor> values;
};

// Whether a candidate still fails the same way (a replay of it).
using CutFails = std::function<bool(const ShrunkCut&)>;

// Halves the cut-free values along one axis (a dimension and its size) at a
// time: every value with that many elements in that dimension at once (the
// rows of one batch together, an index with what it indexes, the tokens of
// every [batch, tokens, hidden] value), keeping the first half or else the
// second, while `fails` holds. Axes are tried largest first; repeats until
// none can be halved. The kept ops' outputs keep their recorded
// metadata: the caller replays the result to know them.
ShrunkCut ShrinkRows(ShrunkCut in, const CutFails& fails);

// Elements of the cut-free values (leaves no kept op produces).
int64_t CutFreeElements(const formats::Trace& cut);

}  // namespace moerr::replayer
