// A torch.distributed collective as the dispatcher sees it (docs/TORCH.md,
// "Collectives from the dispatcher"): in torch 2.x every ProcessGroup method
// calls a `c10d::` op (`allreduce_`, `alltoall_base_`, ...; torch/csrc/
// distributed/c10d/Ops.cpp) whose boxed arguments hold the tensors, the
// ProcessGroup and the options, and whose last output is the Work. The
// schemas carry no alias annotations, so which argument is sent and which
// is written is the table in dispatched_collective.cpp.
//
// Point to point (`send`, `recv_`) is not read here: Gloo's work for it has
// no future, so its completion is only seen by whoever waits on it (the
// Python recorder wraps those calls, and runs them with RecordFunction off).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <vector>

#include "absl/status/statusor.h"
#include "recorder/hooks/collective_hook.h"

namespace moerr::recorder {

struct DispatchedCollective {
  // `group` is the process group's own name (ProcessGroup::getGroupName);
  // `seq` is left 0: the tracer names and numbers the call.
  CollectiveCall call;
  std::vector<at::Tensor> inputs;   // what this rank sends
  std::vector<at::Tensor> outputs;  // what the transfer writes (the inputs themselves when in place)
  bool in_place = false;
};

// Whether `op_name` (a RecordFunction's name) is a process group's op
// (`c10d::`): never an ordinary op of the trace.
bool IsDispatchedCollective(const char* op_name);

// The call `args` (the op's boxed arguments) make. NotFound for an op that
// writes nothing the step reads (send, monitored_barrier_); Unimplemented
// for one the recorder cannot see the results of (gather_, scatter_, the
// list alltoall_, recv_ called past the Python recorder's wrapper), naming
// it; InvalidArgument when the arguments are not what the table says, or
// the splits do not cover the tensors' dim 0: torch then refuses the call
// with its own error.
absl::StatusOr<DispatchedCollective> ReadDispatchedCollective(const char* op_name, c10::ArrayRef<c10::IValue> args);

// The future of the Work the op returned (its last output), or null when it
// returned none or its Work has no future.
c10::intrusive_ptr<c10::ivalue::Future> FutureOfWork(c10::ArrayRef<c10::IValue> outputs);

}  // namespace moerr::recorder
