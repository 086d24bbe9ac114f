// corrupt: rank K's first (with @N its N-th) all_to_all of rows after the
// rollout in step 0 delivers another rank's rows scaled by 2^16, as a bad
// link or device would: what it received is not what was sent.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>

#include "moe/faults/rank_fault.h"

namespace moerr::moe {
namespace {

// Watches the collectives from the start, before any recorder: it changes
// what arrived, which the recorder then hashes (collective_hook.h).
class Corrupt : public RankFaultObserver {
 public:
  Corrupt(const RankFaultSpec& spec, Parallel* parallel) : RankFaultObserver(spec, parallel, /*early=*/true) {}

  // Rows only: a corrupted count would make the ranks disagree on sizes and
  // hang, which is the stall fault's business. The first all_to_all at or
  // after @N (default 0) that receives rows from another rank.
  void OnCollectiveEnd(const recorder::CollectiveCall& call, const std::vector<at::Tensor>& outputs) override {
    if (!InStep0Training() || done_ || call.kind != "all_to_all" || !outputs[0].is_floating_point()) return;
    if (all_to_alls_++ < std::max<int64_t>(spec().at, 0)) return;
    int64_t row = 0;
    for (int64_t from = 0; from < static_cast<int64_t>(call.recv_rows.size()); ++from) {
      const int64_t rows = call.recv_rows[static_cast<size_t>(from)];
      if (from != call.group_rank && rows > 0) {
        at::DisableRecordFunctionGuard untraced;  // the link's doing, not an op of the step
        outputs[0].narrow(0, row, rows).mul_(65536);
        done_ = true;
        return;
      }
      row += rows;
    }
  }

 private:
  bool done_ = false;
  int64_t all_to_alls_ = 0;  // step 0's training all_to_alls of floating rows ended so far
};

std::unique_ptr<TrainObserver> Observe(const RankFaultSpec& spec, Parallel* parallel) {
  return std::make_unique<Corrupt>(spec, parallel);
}

constexpr FaultRow kRow{
    FaultKind::kCorrupt, "corrupt", FaultScope::kRanks,
    "rank K's first all_to_all of rows delivers another rank's rows scaled by 2^16, as a bad link would",
    /*failure=*/"", /*rule=*/"",
    /*verdict=*/"the cross-rank check (`moerr verify RUN`) names the all_to_all, the sender, the receiver and the "
    "rows whose hashes differ; the rank's replay stays bitwise (it replays what it received)",
    /*dynamics=*/false, /*in_weights=*/false, nullptr, Observe};

}  // namespace

const FaultRow& CorruptFault() { return kRow; }

}  // namespace moerr::moe
