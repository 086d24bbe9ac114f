// The first overflow of a multi-rank step, in causal order (docs/
// DISTRIBUTED.md, "Bisect across ranks"). Each rank's ops are in execution
// order; a collective is an edge from every sender's earlier ops to the
// receivers' later ones. Values that overflow on one rank reach the others
// only through collectives, and a collective whose received output is not
// finite while what this rank sent is, is where they arrive: on such a rank,
// FindFirstOverflow names the collective itself. Large finite values cross
// the same way before they overflow: on a rank that received them, the
// cause walk (overflow_cause.h) ends at the collective, whose output rose
// far above what the rank itself sent. So the origin is the rank whose first
// overflowing op is not a collective in which a peer sent non-finite values
// (a sum that overflows from finite inputs is an origin itself, on every
// rank of it), and whose cause is not a collective that received the large
// values; among several (ranks that overflowed independently), the one
// whose overflow comes after the fewest collectives of its step, then the
// lowest rank.
//
// That order ranks the ranks' own first overflows. The origin is then found
// row by row (cross_rank_walk.h): from each overflowing rank in that order,
// the cause walk crosses every collective that delivered what went wrong to
// the senders of those rows and goes on there; the first walk that ends at
// an op that exploded, with no stop (an ambiguous crossing, a leaf sent),
// names the origin. When none does, the first rank in that order is
// reported with its own walk (`unexploded` when its walk crossed to a
// sender whose walk found no op that exploded). A rank whose exploded values all left it (its own tokens
// never met the expert) can so be the origin while every rank's first
// overflow, its own included, arrived or was received.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/cross_rank_walk.h"
#include "analysis/overflow_cause.h"
#include "formats/collective_op.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"

namespace moerr::analysis {

struct RankOverflow {
  int64_t rank = 0;
  size_t op_index = 0;
  const formats::OpEvent* op = nullptr;  // into the rank's trace
  bool arrived = false;                  // op is a collective in which a peer sent non-finite values
  // The rank's cause is a collective whose output rose far above what the
  // rank sent: the large values arrived from a peer before they overflowed.
  bool received = false;
  size_t collectives_before = 0;         // collectives the rank ran before op
};

struct WorldOverflow {
  int64_t rank = 0;        // where it began
  // On that rank: its first overflow, cause and chain; when the walk crossed
  // collectives (Crossed()), the walk there, from its cause to the op whose
  // output it sent (`first` is that op, not an overflow).
  OverflowCause cause;
  // The walk across ranks from the rank it started on to the origin.
  CrossRankPath path;
  // The walk crossed and went on to a sender, but no walk ended at an op
  // that exploded: `rank` and `cause` are the start rank's own, as when
  // path.stopped.
  bool unexploded = false;
  // Whether `cause` is the origin's walk on a sender (its `first` is the op
  // whose output it sent, not an overflow).
  bool Crossed() const { return !path.crossings.empty() && !path.stopped && !unexploded; }
  // How it spread: the first collective after the first overflow in which
  // the origin sent values that are not finite, and the ranks whose output
  // of it is not finite. Absent when it did not leave the origin.
  std::optional<formats::CollectiveOp> spread;
  std::string spread_module;
  std::vector<int64_t> reached;
  // The first collective on the origin's chain after its cause: where the
  // large values it made left it, before they overflowed (none when the
  // chain stays on the origin's ops).
  std::optional<formats::CollectiveOp> carried;
  std::string carried_module;
  std::vector<RankOverflow> ranks;  // every rank's first overflow, by rank
};

// Nullopt when no rank's step overflows. Points into `world`'s traces.
std::optional<WorldOverflow> FindWorldOverflow(const formats::WorldStep& world, const OverflowOptions& options = {});

// Where `found` began, for --json and annotations: {"rank", "op_index", "op",
// "module", "phase"} and, in an expert, "layer" and "expert".
llvm::json::Object OverflowPlaceJson(const WorldOverflow& found);

}  // namespace moerr::analysis
