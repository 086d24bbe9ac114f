// The cause walk across ranks (docs/DISTRIBUTED.md, "Bisect across ranks").
// A rank's walk (overflow_cause.h) ends at a collective when the values that
// went wrong were received there: the collective's output is not finite
// while what the rank sent is, or it rose kInputRiseBits above what the rank
// sent. The walk then crosses to the senders of the rows that hold them and
// goes on there from the value each sent, down to the op that made it.
//
// Which sender: a received output is split into blocks, one per group rank,
// by kind:
//   * all_to_all: block j is the output's rows [sum(recv_rows[0..j)),
//     +recv_rows[j]), rank j's input rows [sum(j.send_rows[0..i)),
//     +j.send_rows[i]) for receiver i;
//   * all_gather: block j is output j (a list: the output the walk came
//     through names its one sender) or the j-th of group_size equal row
//     blocks of the one output, rank j's whole input;
//   * broadcast: the root's whole input;
//   * all_reduce, reduce_scatter: every element sums every rank's input.
// A carrier is, when the received output is not finite, a block that holds
// values that are not finite; when it is finite, a block whose abs-max
// stands kInputRiseBits above what the receiver sent (and within
// kInputRiseBits of the largest block).
// Evidence: "values" when the received output is stored in the bundle
// (replayable and full recordings: recv/<id>) and each block is read;
// "inputs" when only fingerprints exist and the block is the sender's whole
// input (all_gather, broadcast): exact all the same; "whole inputs" when a
// sender's input is larger than its block or is summed (all_to_all in a
// stats recording, all_reduce, reduce_scatter): a sender is a candidate when
// its whole input holds such values, and the block it sent this rank has
// rows. Several carriers found from values or exact inputs all carried
// them: the walk follows the first and lists the others. Several candidates
// from whole inputs are ambiguous: the walk stops there and says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/overflow_cause.h"
#include "formats/collective_op.h"
#include "formats/world_run.h"

namespace moerr::analysis {

// A sender whose rows carried the values.
struct Carrier {
  int64_t rank = 0;        // world rank
  size_t op_index = 0;     // its record of the collective
  // all_to_all: its input rows [sent_row, +rows) went to the receiver and
  // arrived as the receiver's rows [received_row, +rows); -1: the whole
  // tensor (other kinds).
  int64_t sent_row = -1, received_row = -1, rows = 0;
  double abs_max = 0;      // the block's finite abs-max (the input's, from whole inputs)
  bool finite = true;      // the block (the input) holds only finite values
};

// One collective the walk crossed, from the receiver's side.
struct Crossing {
  formats::CollectiveOp collective;  // as the receiver recorded it
  std::string module;
  int64_t receiver = 0;              // world rank
  size_t receiver_op = 0;
  bool not_finite = false;           // what crossed: values that are not finite (else large finite ones)
  std::string evidence;              // "values", "inputs" or "whole inputs" (above)
  std::vector<Carrier> carriers;     // the walk went on at carriers.front() unless ambiguous
  bool ambiguous = false;
};

// The walk on one rank: from its cause to where it ends (the first overflow
// on the rank the walk started from; on a sender, the op whose output it sent).
struct RankWalk {
  int64_t rank = 0;
  OverflowCause walk;
  bool ends_in_overflow = false;  // walk.first is the rank's first overflow
};

// What a sender sent that no op of its step made (a parameter, the batch):
// where a walk that crossed to it ends.
struct SentLeaf {
  int64_t rank = 0;     // world rank of the sender
  size_t op_index = 0;  // its record of the collective
  const formats::OpEvent* op = nullptr;  // that record, in its trace
  uint64_t tensor = 0;  // the input it sent; 0 when the record names none
  std::string name;     // the bundle's name of that tensor when captured, else empty
};

struct CrossRankPath {
  // walks.front() is where the walk started, walks.back() where it ended
  // (the origin); crossings[k] led from walks[k] (the receiver) to
  // walks[k + 1] (the sender).
  std::vector<RankWalk> walks;
  std::vector<Crossing> crossings;
  // The last crossing named no op to go on from: it is ambiguous
  // (crossings.back().ambiguous), or its one sender sent a value no op of
  // its step made (`leaf`).
  bool stopped = false;
  std::optional<SentLeaf> leaf;
};

// The group ranks of `c`, a collective `rank` ran, that the walk visits:
// c.group_size (the bundle's word) bounded by the size of the manifest's
// instance of c.group holding `rank`.
int64_t GroupMembers(const formats::WorldStep& world, const formats::CollectiveOp& c, int64_t rank);

// The walk from rank `start`'s overflow cause `start_cause` (its
// FindOverflowCause), across every collective that delivered what went
// wrong. Points into `world`'s traces.
CrossRankPath WalkAcrossRanks(const formats::WorldStep& world, int64_t start, const OverflowCause& start_cause);

// "rank 2 aten::linear in blocks.0.moe.experts.0 -> all_to_all #3 in world
// (rows 0-3 to rank 0) -> rank 0 aten::layer_norm in blocks.1.norm": from
// the origin to where the walk started. A leaf starts "rank 1 input tensor 7
// (param/w) -> ...", an ambiguous stop "rank ? (ambiguous) -> ...".
std::string DescribePath(const CrossRankPath& path);

// The path as JSON, origin first: rank nodes {"rank", "op_index", "op",
// "module", "phase"} (a leaf's: the sender's collective, with "leaf":
// {"tensor", "name"}) and between them crossing nodes {"collective", "group",
// "seq", "module", "from", "to", "evidence", "not_finite", "ambiguous",
// "carriers": [{"rank", "sent_rows", "received_rows", "abs_max", "finite"}]}.
llvm::json::Array PathJson(const CrossRankPath& path);

}  // namespace moerr::analysis
