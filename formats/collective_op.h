// A collective (all_reduce, all_to_all, broadcast, all_gather,
// reduce_scatter) as an op of a rank's trace (docs/DISTRIBUTED.md,
// "Collectives in the trace"). The recorder writes it as an OpEvent named
// "c10d::<kind>" whose arguments carry what the cross-rank checks need;
// this is the one place that knows their layout.
//
// Slices: an all_to_all sends rows [sum(send_rows[0..j)), +send_rows[j]) of
// its input to group rank j and receives group rank i's rows at the same
// place of its output by recv_rows; every other kind has one slice, the
// whole tensor. Each slice's hash is XXH3-64 of its bytes, so what rank i
// sent to rank j can be matched with what j received from i.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/trace.h"

namespace moerr::formats {

struct CollectiveOp {
  std::string kind;     // all_reduce, all_to_all, broadcast, all_gather, reduce_scatter
  std::string group;    // the process group's name: world, expert-parallel, expert-replica, or a caller's
  int64_t seq = 0;      // this group's collectives issued before it on this rank, from 0
  int64_t group_rank = 0, group_size = 1;
  int64_t root = -1;    // broadcast: the group rank that sends; else -1
  std::vector<int64_t> send_rows, recv_rows;          // all_to_all: rows per group rank; else empty
  std::vector<uint64_t> send_hashes, recv_hashes;     // per slice (see above)
  std::vector<uint64_t> inputs;                       // tensor ids this rank sent
};

inline constexpr absl::string_view kCollectivePrefix = "c10d::";
// The step annotation of a bundle imported from a c10d Flight Recorder dump
// (importers/flight_recorder_import.h): per op, what the trace has no field
// for (state, frames, timings).
inline constexpr char kFlightRecorderAnnotation[] = "flight_recorder";

// Whether `op` is a collective of the trace.
bool IsCollective(const OpEvent& op);
// The collectives among trace.ops[0, end).
size_t CountCollectives(const Trace& trace, size_t end = SIZE_MAX);
bool IsCollectiveName(absl::string_view name);

// The collective `op` records; DataLoss when its arguments are not the layout
// ToOpEvent writes, or its split sizes are not rows: send_rows and recv_rows
// are each empty or one count per group rank, every count >= 0 and their
// sum within int64 (so RowsBefore cannot overflow).
absl::StatusOr<CollectiveOp> CollectiveOf(const OpEvent& op);

// The rows before slice `slice` of split sizes `rows` as CollectiveOf
// returns them: sum(rows[0..slice)), `slice` clamped to [0, rows.size()].
int64_t RowsBefore(const std::vector<int64_t>& rows, int64_t slice);

// Whether split sizes `rows` split `total` rows: every count in [0, total]
// and their sum `total`. Checks each count before summing, so any vector is safe.
bool SplitsRows(const std::vector<int64_t>& rows, int64_t total);

// The index in `trace` of the collective at (c.group, c.seq); nullopt when
// the rank ran none.
std::optional<size_t> FindCollective(const Trace& trace, const CollectiveOp& c);

// Writes `c`'s kind into op.name and its fields into op.args (replacing
// them); op.outputs, phase and module are the caller's.
void ToOpEvent(const CollectiveOp& c, OpEvent& op);

// "all_to_all #17 in expert-parallel" (with the module when known).
std::string DescribeCollective(const CollectiveOp& c, absl::string_view module = "");

}  // namespace moerr::formats
