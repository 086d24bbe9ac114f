// Who broke the collective order (docs/DISTRIBUTED.md, "Hangs and
// desyncs"): the ranks of a process group must issue the same collectives
// in the same order with the same sizes and dtypes. Per group, from each
// rank's collectives aligned by sequence number, this names the last one
// every rank completed, the first sequence number where they disagree, and
// at it which ranks never entered it, which entered another kind, and which
// entered with other sizes or dtypes, with each side's call site.
//
// Reads a recorded run and one imported from c10d Flight Recorder dumps
// alike: the trace's collectives (formats/collective_op.h), and where the
// step has the Flight Recorder annotation, its states and Python frames.
// A rank whose bundle is absent is missing: it is named, not judged, and
// never called hung.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/order_strip.h"
#include "formats/world_run.h"
#include "llvm/Support/JSON.h"

namespace moerr::analysis {

// One rank's call at a sequence number: one op, or a coalesced group's ops.
struct CollectiveCall {
  std::string kind;  // the ops' kinds, "+"-joined when coalesced
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  std::string state;   // Flight Recorder's ("scheduled", "started", "completed"), else ""
  std::string where;   // the innermost frame outside torch, or the op's module
  std::vector<std::string> frames;  // "file:line in function", innermost first
  int64_t op = -1;     // the first op's index in the rank's trace
  // A coalesced group's ops in call order (Flight Recorder's entries that
  // share one collective_seq_id, less the "coalesced" entry that closes
  // them), compared op by op as torch's analyzer compares them; empty for
  // one op. The fields above join theirs.
  std::vector<CollectiveCall> coalesced;
};

struct OrderSide {
  enum class Kind { kExpected, kNeverEntered, kOtherKind, kOtherSizes };
  Kind kind = Kind::kExpected;
  std::vector<int64_t> ranks;
  CollectiveCall call;       // what they called there; kNeverEntered: their last call
  int64_t last_seq = -1;     // the last sequence number they reached
  int64_t calls_ahead = 0;   // their last_seq minus the expected side's
};

// A point-to-point transfer that did not pair up: the `index`-th send from
// `sender` to `receiver` against the `index`-th recv of `receiver` from
// `sender` (Flight Recorder dumps only: a recording has no send or recv).
struct P2PMismatch {
  int64_t sender = -1, receiver = -1;  // world ranks
  int64_t index = 0;                   // among that pair's transfers, from 0
  std::string what;                    // "no recv", "no send", or the sizes that differ
  CollectiveCall send, recv;           // what each side called (kind "" where it has none)
};

struct GroupOrder {
  std::string group;  // the trace's name: "world", "pg1"
  std::string desc;   // Flight Recorder's description ("default_pg"), or ""
  std::vector<int64_t> ranks, missing;  // members; those with no bundle
  // The last sequence number every present member completed, and its call
  // (-1: none).
  int64_t last_completed = -1;
  CollectiveCall completed_call;
  // The first sequence number where present members disagree; -1: none.
  int64_t first_disagreement = -1;
  std::vector<OrderSide> sides;  // at it: the expected side first
  bool flight_recorder = false;  // numbered as Flight Recorder's collective_seq_id - 1
  // The first sequence number compared (ring buffers keep the last calls),
  // and each present member's last one (-1: none in the group).
  int64_t first_seq = 0;
  std::map<int64_t, int64_t> reached;
  // Point-to-point ops, paired by sender and receiver in order: the first
  // that does not pair up, per pair.
  std::vector<P2PMismatch> p2p;
  OrderStrip strip;
  bool Broken() const { return first_disagreement >= 0 || !p2p.empty(); }
};

std::vector<GroupOrder> CheckCollectiveOrder(const formats::WorldStep& world);

// "group world (default_pg, 4 ranks): every rank completed all_reduce #3;
// at #4 ranks 0, 1, 3 wait in all_reduce #4 (train.py:40 in step); rank 2
// never entered it: its last call is all_reduce #3, 1 fewer than its peers".
std::string DescribeGroupOrder(const GroupOrder& g);
// "#8", or "#9" where the group is numbered as Flight Recorder numbers.
std::string SeqName(const GroupOrder& g, int64_t seq);
// `seq` as shown: 1 more where numbered as Flight Recorder numbers, at most
// INT64_MAX (a dump's numbers are untrusted).
int64_t ShownSeq(int64_t seq, bool flight_recorder);
// a + b, or the int64 bound it passes.
int64_t SaturatingAdd(int64_t a, int64_t b);
llvm::json::Object GroupOrderJson(const GroupOrder& g);
const char* SideKindName(OrderSide::Kind kind);

}  // namespace moerr::analysis
