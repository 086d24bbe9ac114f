// Checks across the ranks of one step (docs/DISTRIBUTED.md, "Replay and
// bisect across ranks"), from the recorded collectives alone
// (formats/collective_op.h):
//
//  * consistency: what rank i sent in collective #s of a group is what rank
//    j says it received, slice by slice, by hash and row count; every rank
//    of an all_reduce holds the same result; every rank of a broadcast holds
//    the root's tensor. A mismatch is a corrupted transfer or a bad device.
//  * fates: which rank finished the step, which died and after which op,
//    and which collective each surviving rank was waiting in when it timed
//    out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/check.h"
#include "formats/collective_op.h"
#include "formats/world_run.h"

namespace moerr::analysis {

struct CollectiveMismatch {
  formats::CollectiveOp collective;  // as the receiver recorded it
  std::string module;                // the receiver's op's module
  int64_t sender = -1, receiver = -1;  // world ranks
  int64_t first_row = 0, rows = 0;     // the slice, in the receiver's output
  std::string what;                    // what disagrees, in words
};

// Every disagreement between the ranks of `world` that have the step. A
// rank that did not finish the step is not blamed for the collectives it
// never reached.
std::vector<CollectiveMismatch> CheckCollectives(const formats::WorldStep& world);

struct RankFate {
  // kDumped: a Flight Recorder dump, which says how far its collectives
  // got (collective_order.h), not how the step ended.
  enum class Kind { kFinished, kDied, kWaited, kUnreadable, kDumped };
  int64_t rank = 0;
  Kind kind = Kind::kFinished;
  size_t ops = 0;             // ops it recorded in the step
  std::string last_op;        // "op 812: aten::mm in model.layers.1.mlp.experts.5 (forward)", "" when none
  std::string waited_in;      // kWaited: "all_to_all #3 in expert-parallel (model.layers.1.mlp)"
  std::string detail;         // the collective's error, or why the bundle could not be read
};

std::vector<RankFate> RankFates(const formats::WorldStep& world);

// The rows each rank received in one all_to_all of floating values: the
// `pass`-th such all_to_all in forward of `module`, on every rank that ran
// it. In an MoE layer the first is the dispatch (the tokens each rank's
// experts process; the slowest rank sets the step time), the second the
// combine (each rank's own tokens coming back).
struct RankLoad {
  std::string module;
  int64_t pass = 0;
  std::vector<int64_t> rows;  // by rank; -1 where the rank has no such all_to_all
  double imbalance = 1;       // the largest over the mean of the ranks that have it
};
std::vector<RankLoad> RankLoads(const formats::WorldStep& world);

// A lint finding "rank-imbalance" for the worst RankLoad of the step: a
// warning when the busiest rank receives at least `warn_ratio` times the
// mean, else a note with the numbers. None without all_to_alls.
std::vector<Finding> CheckRankBalance(const formats::WorldStep& world, double warn_ratio = 1.5);
const char* FateName(RankFate::Kind kind);

}  // namespace moerr::analysis
