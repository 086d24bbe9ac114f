// The op tracer: a global at::RecordFunction observer that records the
// outermost ATen op on each thread, in forward, backward and optimizer, as an
// OpEvent (DESIGN.md, "The trace"). Inputs are read in the start callback,
// outputs in the end callback. Fingerprints, byte captures and the hand-off
// to the sink run on a TraceWorker thread; an op that writes a tensor first
// waits until the worker has read it.
//
// Tensor ids follow TensorImpl identity and version counter
// (tensor_identities.h). A tensor read before any recorded op produced it is
// a leaf; in replayable and full modes its bytes are captured at first use.
// Module paths come from USER_SCOPE records (the model pushes
// "model.layers.3.mlp.experts.5"); a backward op takes the path of the
// forward op whose autograd node it runs. Values first seen in backward
// (saved inside composite ops, engine buffers) are captured as "saved/<id>",
// not leaves. Ops inside a scope named "optimizer" are in the optimizer
// phase; leaves first read inside a scope named "batch" are the batch. Ops
// inside a scope named "generate" are not recorded: a rollout's sampling
// loop is the inference engine's work, not the training step's, and what it
// returns is a leaf of the step (read it first inside "batch" to make it
// part of the batch).
//
// When the tracer is the only RecordFunction observer, it turns
// RecordFunction off on a thread for what it does not record: inside an
// outermost op (until its end) and inside "generate". LibTorch then boxes no
// arguments for those ops and calls back only for the recorded ops and the
// scopes around them. Beside another observer (a profiler) it leaves
// RecordFunction on, and that observer sees every op.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <atomic>
#include <memory>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_set.h"
#include "formats/bundle_index.h"
#include "formats/trace.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/collective_hook.h"
#include "recorder/tensor_identities.h"
#include "recorder/trace_worker.h"

namespace moerr::recorder {

enum class CaptureMode { kStats, kReplayable, kFull };
absl::StatusOr<CaptureMode> ParseCaptureMode(const std::string& name);  // stats, replayable, full
std::string CaptureModeName(CaptureMode mode);

// Where the tracer's output goes (the Recorder).
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  // A finished batch of ops. The sink may move it out (to keep it); what it
  // leaves goes back to the tracer, which refills it in place.
  virtual void OnOps(formats::OpBatch& batch) = 0;
  // A snapshot (a private copy) of a leaf, a random op's output, or (full
  // mode) an op output, to store under `name`.
  virtual void OnTensorBytes(std::string name, formats::Role role, at::Tensor snapshot) = 0;
  // Work for the trace failed (a capture LibTorch could not copy); the sink
  // reports it where it reports its own errors.
  virtual void OnError(absl::Status status) = 0;
  // The tracer has handed over every op up to a collective's start or
  // arrival: the sink makes them durable (a rank may die or stall in a
  // collective). Called on the thread that launched or completed it.
  virtual void Persist() {}
  // A collective launched from the dispatcher failed: its work completed
  // with an error (`why`). `module`: where it was launched.
  virtual void OnCollectiveFailed(const CollectiveCall& call, const std::string& module, const std::string& why) {}
};

// Defined in op_tracer.cpp: a thread's op nesting, scopes and autograd
// nodes; a recorded op's event between its start and end callbacks.
struct ThreadState;
struct OpScratch;
struct PendingCollective;

class OpTracer {
 public:
  // At most one tracer exists at a time. `batch_ops`: ops per OpBatch handed
  // to the sink (smaller: less lost in a crash, more records).
  OpTracer(CaptureMode mode, TraceSink* sink, size_t batch_ops = 1024);
  ~OpTracer();
  OpTracer(const OpTracer&) = delete;
  OpTracer& operator=(const OpTracer&) = delete;

  void set_enabled(bool on);
  // Eager: each op is handed to the sink as it ends, not in batches, and
  // the traced thread waits until the sink has it (after a step's first
  // overflow, so that a crash loses none of what follows; it slows that
  // step alone). Any thread may set it.
  void set_eager(bool on) { eager_.store(on, std::memory_order_relaxed); }
  // Forgets the autograd attribution of earlier steps (call at a step start).
  void NewStep();
  // Names parameters' leaves "param/<name>" instead of "leaf/<id>".
  void NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named);
  // Hands the pending ops to the sink; returns once the sink has them.
  void Flush();
  uint64_t ops_recorded() const;

  // The names the trace gives process groups, by their own names
  // (ProcessGroup::getGroupName): what a collective from the dispatcher is
  // recorded under. A group not named here is "c10d:<its name>".
  void NameGroups(const std::vector<std::pair<std::string, std::string>>& names);

  // Collectives come two ways. From the dispatcher (torch 2.x's `c10d::`
  // ops, dispatched_collective.h), seen by the RecordFunction callbacks
  // like any op: the start names what is sent and hashes it, and numbers
  // the call in its group; the end adds a callback to the Work's future,
  // which records what arrived when the transfer completes (asynchronous
  // work stays asynchronous) and gives the op its place in the trace
  // there, before whoever waits on the work can read the output. A
  // collective the step did not wait for before it ended is not recorded.
  //
  // Or from a process group that calls the recorder itself around the
  // transfer, on the thread that runs it (hooks/collective_hook.h: the
  // reference trainer's, the Python recorder's wrappers), with these two.
  // Either way the op (formats/collective_op.h) is built alike. Start names
  // what the rank sends (leaves when new) and hashes its slices; before an
  // in-place collective it waits for the worker's reads of its inputs. End
  // gives what arrived new ids (the bytes changed outside any ATen op, so
  // their version is bumped), hashes its slices and, in replayable and full
  // modes, captures it as "recv/<id>" so that the rank replays alone (a
  // slot of a larger buffer: the whole storage). A collective inside a
  // recorded op or an untraced scope, or while the tracer is off, is not
  // recorded. Both return whether the collective is (being) recorded.
  bool CollectiveStart(const CollectiveCall& call, const std::vector<at::Tensor>& inputs, bool in_place);
  bool CollectiveEnd(const CollectiveCall& call, const std::vector<at::Tensor>& outputs);
  // The collective started on this thread failed: it is dropped, and the ops
  // before it go to the sink. Returns its module ("" when not recorded).
  std::string CollectiveFailed();

  // A collective from the dispatcher completed (`error`: it failed, why);
  // public for the Work's future callback.
  void CollectiveArrived(PendingCollective& pending, const std::string* error);
  // Its callback threw (a copy LibTorch could not make): the sink hears why.
  void CollectiveCallbackFailed(const std::string& why);
  // The number of the next collective in `group` (the trace's name for it),
  // for a collective the tracer does not see from the dispatcher (the
  // Python recorder's wrappers), so that the group has one numbering.
  int64_t NextCollectiveInGroup(const std::string& group);

  // The RecordFunction callbacks (public for the C callback trampolines).
  std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn);
  void OnEnd(const at::RecordFunction& fn, at::ObserverContext* ctx);

 private:
  // How an op uses an argument: the phase markers around the op, and whether
  // its schema marks the argument as written (in place, out=), not read.
  struct ArgUse {
    bool in_optimizer = false, in_batch = false, in_backward = false;
    bool written = false;
  };
  // The id of `t` as an input; a new id (and a leaf) when unknown.
  uint64_t InputId(const at::Tensor& t, const ArgUse& use);
  // What the tracer needs of the operator an op runs, worked out once per
  // operator (InfoOf, keyed by its schema name): from
  // its schema, which arguments it may write (alias annotations) and whether
  // it returns nothing (an in-place `_foreach_*_` op, whose results are the
  // tensors it wrote); from its name, whether it draws random numbers and
  // whether it allocates without filling (`empty`...), and whether it is
  // an op outside ATen (a vendor's or a program's own, which another
  // LibTorch may not have).
  struct SchemaInfo {
    std::vector<bool> written;
    bool returns_nothing = false;
    bool random = false;
    bool external = false;
    bool allocates_uninitialised = false;
  };
  uint64_t OutputId(const at::Tensor& t, int64_t producer, const SchemaInfo& op, const std::vector<ViewSource>& inputs);
  // `derive_from`: `t` is a dense view of exactly that input's elements.
  uint64_t NewTensor(const at::Tensor& t, int64_t producer, std::string leaf_name, formats::Role role,
                     uint64_t view_of = 0, const ViewSource* derive_from = nullptr);
  const SchemaInfo& InfoOf(const at::RecordFunction& fn);
  // Runs the worker's queued reads of every tensor `fn` may write (mu_ held);
  // appends those tensors to `written` when given.
  void WaitBeforeWrites(const at::RecordFunction& fn, const SchemaInfo& info,
                        std::vector<at::Tensor>* written = nullptr);
  // Fills `a` (a reused slot) with the recorded form of `v`.
  void ToArg(const c10::IValue& v, const ArgUse& use, std::vector<ViewSource>& sources, formats::OpArg& a);
  static bool RecordWrappedNumber(const at::Tensor& t, formats::OpArg& a);
  static bool RecordNumberList(const c10::IValue& v, formats::OpArg& a);
  void FlushLocked();
  // The collectives' steps (op_tracer_collectives.cpp), mu_ held: the event
  // and what is sent; what arrived, and the op into the batch.
  std::shared_ptr<PendingCollective> BeginCollective(const CollectiveCall& call, const std::vector<at::Tensor>& inputs,
                                                     bool in_place, const ThreadState& st);
  void EndCollective(PendingCollective& pending, const std::vector<at::Tensor>& outputs);
  std::unique_ptr<at::ObserverContext> StartDispatched(const at::RecordFunction& fn, ThreadState& st);
  void LaunchDispatched(const at::RecordFunction& fn, std::shared_ptr<PendingCollective> pending);
  // Every op so far to the sink, and the sink's Persist.
  void Persist();
  // Records each collective in flight whose future has completed (mu_
  // held). A thread that waits on the future itself, not on the Work (DDP's
  // reducer), wakes before the future's callbacks run: its next op records
  // the collective first.
  void RecordCompletedLocked();
  // The collective has arrived (mu_ held): recorded when `ok` and its step is
  // still being recorded, then out of the flight list. Once per collective;
  // returns whether this call was the one and its step is being recorded.
  bool ArriveLocked(PendingCollective& pending, bool ok);
  // Moves a finished op into the pending batch, handing the batch on when
  // full (mu_ held). `op` keeps the capacity of the slot it is swapped with.
  void AppendOp(formats::OpEvent& op);

  // OnStart's steps. Where an outermost op runs, from its thread's scopes
  // and autograd nodes.
  struct Placement {
    formats::Phase phase = formats::Phase::kForward;
    bool in_optimizer = false, in_batch = false;
    int64_t node = -1;         // backward: the autograd node it runs for
    const char* module = "";   // forward: the innermost module scope
  };
  static Placement PlaceOp(const ThreadState& st);
  // Entering an untraced scope as the only observer: drains the worker and
  // turns RecordFunction off on this thread.
  void SilenceUntracedScope();
  // Sets every field of the scratch's reused event but its arguments and
  // outputs (mu_ held).
  void BeginEvent(const at::RecordFunction& fn, const c10::OperatorName& name, uint32_t thread,
                  const Placement& where, OpScratch& scratch);
  // The event's phase and module from where it runs: "optimizer", the
  // forward op's module for backward work, else the innermost module scope.
  void PlaceEvent(const Placement& where, formats::OpEvent& op) const;
  // A backward op's forward op and module, from the autograd node it runs
  // for (node_ranges_).
  void AttributeToForward(int64_t node, formats::OpEvent& op) const;
  // Names the op's arguments, then waits for the worker's reads of what the
  // op writes (mu_ held).
  void RecordInputs(const at::RecordFunction& fn, const Placement& where, OpScratch& scratch);

  CaptureMode mode_;
  size_t batch_ops_;
  TraceSink* sink_;
  // What a Work's future callback holds: the tracer while it lives. The
  // callback runs under `mu`, so the destructor waits for one running.
  struct Liveness {
    std::mutex mu;
    OpTracer* tracer = nullptr;
  };
  std::shared_ptr<Liveness> live_;
  at::CallbackHandle handle_;
  mutable std::mutex mu_;
  bool enabled_ = true;
  uint64_t next_seq_ = 0;
  uint64_t step_ = 0;  // NewStep calls
  absl::flat_hash_map<std::string, std::string> group_names_;  // NameGroups
  absl::flat_hash_map<std::string, int64_t> group_calls_;      // collectives per group so far
  // Collectives from the dispatcher launched and not yet recorded.
  std::vector<std::shared_ptr<PendingCollective>> in_flight_;
  uint64_t recorded_ = 0;
  // The batch being filled; elements from pending_ops_ / pending_tensors_
  // on are a spare batch's slots, overwritten before use.
  formats::OpBatch pending_;
  size_t pending_ops_ = 0, pending_tensors_ = 0;
  TensorIdentities ids_;
  // Autograd sequence numbers [begin, end) of the nodes a forward op made,
  // with the op's seq and module, for attributing backward ops; sorted by
  // begin. An empty range marks the first op after numbers no recorded op
  // took (a custom Function's node).
  struct NodeRange {
    int64_t begin, end;
    uint64_t seq;
    const std::string* module;  // in modules_
  };
  std::vector<NodeRange> node_ranges_;
  absl::node_hash_set<std::string> modules_;  // module paths, at stable addresses
  // By the name pointer an op's schema owns (stable for the process).
  absl::flat_hash_map<const char*, SchemaInfo> schema_info_;
  std::atomic<bool> eager_{false};
  TraceWorker worker_;  // last: destroyed first, after the final flush
};

}  // namespace moerr::recorder
