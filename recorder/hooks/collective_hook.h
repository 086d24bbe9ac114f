// The hooks a rank's process-group calls around each collective. Header-only:
// the process groups (distributed/, the Python binding) include it without
// linking the recorder, which implements it (formats/collective_op.h is how
// the recorder writes a collective into the trace).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moerr::recorder {

struct CollectiveCall {
  std::string kind;   // all_reduce, all_to_all, broadcast, all_gather, reduce_scatter
  std::string group;  // the group's name (world, expert-parallel, expert-replica, ...)
  int64_t seq = 0;    // this group's collectives issued before it on this rank
  int64_t group_rank = 0, group_size = 1;
  int64_t root = -1;  // broadcast: the group rank that sends
  std::vector<int64_t> send_rows, recv_rows;  // all_to_all: rows (dim 0) per group rank
};

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  // Before the transfer. `inputs` hold what this rank sends; `in_place`: the
  // collective writes its result into them (all_reduce, broadcast).
  virtual void OnCollectiveStart(const CollectiveCall& call, const std::vector<at::Tensor>& inputs,
                                 bool in_place) = 0;
  // After the transfer: `outputs` hold what arrived. Observers run in the
  // order they were added. One that changes the outputs (a fault standing
  // for a bad link) must be added before any recorder: the recorder hashes
  // and queues them for capture here, and a later write would race its
  // worker.
  virtual void OnCollectiveEnd(const CollectiveCall& call, const std::vector<at::Tensor>& outputs) = 0;
  // The transfer failed or timed out (`why`): this rank waited in it.
  virtual void OnCollectiveFailed(const CollectiveCall& call, const std::string& why) = 0;
};

}  // namespace moerr::recorder
