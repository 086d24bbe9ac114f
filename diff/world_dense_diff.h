// The dense ops of a world replayed on fewer ranks (replayer/world_replay.h)
// against the record. Replay rank m's dense op runs on the rows of the
// k = N/M original ranks [m*k, (m+1)*k) at once; those k ranks ran the same
// dense program on their own rows, so their ops pair up by position, and
// their outputs' fingerprints combine into the fingerprint of all their
// rows (CombineFingerprints), which is compared with the replay's. An
// output the k ranks hold the same value of (a replicated weight, its
// update) is compared with that value.
//
// Dense: not in a routed expert (world_diff.h compares those), not the MoE
// block's own dispatch (which differs between expert-parallel layouts), not
// a collective, not the optimizer's (its lists of gradients hold the experts
// a rank hosts, which differ between the worlds). An output whose size is neither k times nor once the
// original's, or whose k originals differ while the sizes are equal (a sum
// over the rows, like a weight's gradient before its all_reduce), or whose k
// equal originals the replay holds k times of (equal sums over each rank's
// rows, like a count of tokens), has no counterpart: it is counted, not
// judged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "diff/trace_diff.h"
#include "formats/trace.h"
#include "formats/world_run.h"

namespace moerr::diff {

// The fingerprint of the concatenation of tensors with these fingerprints:
// sizes and counts added, extremes taken, L2 norms added in quadrature,
// means (over the finite values) weighted by their finite values; the
// content hash unknown.
formats::Fingerprint CombineFingerprints(const std::vector<formats::Fingerprint>& parts);

struct DenseDiff {
  int64_t replay_rank = 0;
  int64_t first_rank = 0, ranks = 0;  // the original ranks it stands for
  size_t outputs = 0;                 // outputs with a counterpart, judged
  size_t diverged = 0;                // of them, beyond the dtype's threshold (or a NaN/Inf count differs)
  size_t without_counterpart = 0;     // outputs not judged (above)
  size_t unaligned = 0;               // replayed dense ops some original rank has no partner for
  double max_error = 0;
  std::string worst;  // the op with the largest error
};

// One entry per replay rank; empty unless `b` has fewer ranks than `a`
// and divides it. A rank either run could not read is an error naming it.
absl::StatusOr<std::vector<DenseDiff>> DiffMergedDense(const formats::WorldStep& a, const formats::WorldStep& b,
                                                       const Thresholds& thresholds);

}  // namespace moerr::diff
