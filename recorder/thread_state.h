// The op tracer's per-thread state, shared by its files (op_tracer.cpp,
// op_tracer_collectives.cpp). Internal to the recorder.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "formats/trace.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/collective_hook.h"

namespace moerr::recorder {

// What a recorded op needs between its start and end callbacks. Reused:
// the event's strings and vectors keep their capacity from op to op (the
// event is swapped with a spent batch's slot when the op ends), so building
// an event allocates nothing once the batches are warm.
struct OpScratch {
  formats::OpEvent op;
  std::vector<ViewSource> sources;
  // An op that returns nothing (in-place `_foreach_*_`): the tensors it
  // writes, in argument order, recorded as its outputs.
  std::vector<at::Tensor> written;
  int64_t seq_begin = -1;
};

// A collective being recorded (op_tracer_collectives.cpp): what is known when
// it starts; what arrived is added when its transfer completes, on whatever
// thread completes it.
struct PendingCollective {
  formats::OpEvent event;  // thread, phase, module; seq and outputs when it arrives
  CollectiveCall call;
  // What was sent: tensor ids, and one hash per slice (formats::CollectiveOp).
  std::vector<uint64_t> inputs, send_hashes;
  uint64_t step = 0;         // the tracer's step it started in
  // Launched from the dispatcher: what the transfer writes, and its Work's
  // future. `recorded`: a collective of the step (else only a failure is
  // reported); `arrived`: handled, by whichever thread saw it complete first.
  std::vector<at::Tensor> outputs;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool recorded = true, arrived = false;
};

// Per-thread state: nesting of ATen ops, the user-scope stack and the
// autograd nodes running.
struct ThreadState {
  int depth = 0;
  // The open user scopes, innermost last. A copy of each name: a scope's
  // record may end unseen (while no tracer listens) and its name with it.
  // `id` (the record's name's address, never read through) finds the scope
  // a record ends, which need not be the innermost.
  struct Scope {
    const void* id = nullptr;
    std::string name;
  };
  std::vector<Scope> scopes;
  // The tracer this state was built under (State() starts it afresh for a
  // new one: what a finished recording left open is not the next one's).
  uint64_t generation = 0;
  // Running autograd nodes: sequence number, and the op depth outside the
  // node. A node's ops are outermost ops of their own: backward() is itself
  // an op (aten::_backward) that the whole backward pass runs inside.
  std::vector<std::pair<int64_t, int>> backward;
  // Inside aten::_backward: the engine's own ops (gradient accumulation
  // between nodes, the root gradient) are backward ops too.
  int in_backward_call = 0;
  // Sequence numbers of the nodes the engine is evaluating: its ops outside
  // the node (accumulating that node's gradients) are attributed to it.
  std::vector<int64_t> evaluating;
  int untraced = 0;  // open kUntracedScope scopes
  // RecordFunction is off on this thread, turned off by the tracer (see
  // OnlyObserver) for the outermost op running, or for the untraced scope open.
  bool silenced_op = false, silenced_scope = false;
  uint32_t thread = 0;
  // A process group's worker (Gloo names its threads "pt_gloo_runloop"):
  // the ATen ops it runs are the transport's (copies into an all_gather's
  // output list), not the step's, and are not recorded.
  bool transport = false;
  // A collective that a process group's caller started on this thread
  // (OpTracer::CollectiveStart) and has not ended.
  std::shared_ptr<PendingCollective> collective;
};

// What an op's start callback hands its end callback.
struct OpContext : at::ObserverContext {
  std::unique_ptr<OpScratch> scratch;  // a recorded op; null when transparent
  // Not an op of its own: aten::_backward, or a named record that is no
  // dispatcher op (the engine's "autograd::engine::evaluate_function: ...").
  bool transparent = false;
  bool backward = false;  // ... and what runs inside it is backward work
  // A collective from the dispatcher, recorded when its work completes.
  std::shared_ptr<PendingCollective> collective;

  ~OpContext() override;
};

// This thread's state.
ThreadState& State();
// Scratches not in use, per thread (a thread's outermost ops do not nest).
std::vector<std::unique_ptr<OpScratch>>& ScratchPool();
// A scratch from the pool, or a new one.
std::unique_ptr<OpScratch> TakeScratch();

}  // namespace moerr::recorder
