// OpTracer's collectives (op_tracer.h, NameGroups): from the dispatcher, or
// from a process group that calls the recorder around each transfer.
#include <ATen/ATen.h>
#include <ATen/core/ivalue_inl.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "formats/collective_op.h"
#include "recorder/dispatched_collective.h"
#include "recorder/op_tracer.h"
#include "recorder/thread_state.h"

namespace moerr::recorder {
namespace {

// The tensor the trace records for a collective's output `t`: `t`, or when
// `t` is a part of its storage (a slot of a larger buffer) the whole storage,
// flat. The op's output is served from the record in replay; a part would
// leave the rest of the buffer, read later as a view of it, out of reach.
at::Tensor Recorded(const at::Tensor& t) {
  if (!t.has_storage() || t.layout() != at::kStrided || CoversItsStorage(t)) return t;
  const size_t item = t.dtype().itemsize(), bytes = t.storage().nbytes();
  if (bytes % item != 0) return t;
  at::DisableRecordFunctionGuard untraced;  // the recorder's own ops; no autograd view either
  return t.detach().as_strided({static_cast<int64_t>(bytes / item)}, {1}, 0);
}

// The trace's record of `call`, without what was sent or arrived.
formats::CollectiveOp CollectiveOpOf(const CollectiveCall& call) {
  formats::CollectiveOp c;
  c.kind = call.kind;
  c.group = call.group;
  c.seq = call.seq;
  c.group_rank = call.group_rank;
  c.group_size = call.group_size;
  c.root = call.root;
  c.send_rows = call.send_rows;
  c.recv_rows = call.recv_rows;
  return c;
}

}  // namespace

void OpTracer::NameGroups(const std::vector<std::pair<std::string, std::string>>& names) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [own, ours] : names) group_names_[own] = ours;
}

std::shared_ptr<PendingCollective> OpTracer::BeginCollective(const CollectiveCall& call,
                                                             const std::vector<at::Tensor>& inputs, bool in_place,
                                                             const ThreadState& st) {
  auto pending = std::make_shared<PendingCollective>();
  pending->step = step_;
  pending->call = call;
  formats::OpEvent& op = pending->event;
  const Placement where = PlaceOp(st);
  op.thread = st.thread;
  PlaceEvent(where, op);
  const ArgUse use{where.in_optimizer, where.in_batch, where.phase == formats::Phase::kBackward, false};
  for (const at::Tensor& t : inputs) {
    pending->inputs.push_back(InputId(t, use));
    const std::vector<uint64_t> hashes = SliceHashes(t, call.send_rows);
    pending->send_hashes.insert(pending->send_hashes.end(), hashes.begin(), hashes.end());
  }
  // What the transfer overwrites must be read first (the inputs just named included).
  if (in_place) {
    for (const at::Tensor& t : inputs) worker_.BeforeWrite(t);
  }
  return pending;
}

void OpTracer::EndCollective(PendingCollective& pending, const std::vector<at::Tensor>& outputs) {
  formats::OpEvent& op = pending.event;
  formats::CollectiveOp c = CollectiveOpOf(pending.call);
  c.inputs = std::move(pending.inputs);  // recorded once: EndCollective ends the pending
  c.send_hashes = std::move(pending.send_hashes);
  // Its place in the trace: after every op that ran before its result existed.
  op.seq = next_seq_++;
  // Written by the transport, not by an ATen op: a new version, so that
  // whatever reads it next reads this op's output. All before any is named:
  // slots of one buffer share its version counter.
  for (const at::Tensor& t : outputs) {
    if (t.unsafeGetTensorImpl()->version_counter().enabled()) t.unsafeGetTensorImpl()->bump_version();
  }
  absl::flat_hash_map<const void*, uint64_t> recorded;  // storage -> id, for outputs sharing one
  for (const at::Tensor& t : outputs) {
    const std::vector<uint64_t> hashes = SliceHashes(t, c.recv_rows);
    c.recv_hashes.insert(c.recv_hashes.end(), hashes.begin(), hashes.end());
    const at::Tensor whole = Recorded(t);
    const void* storage = whole.has_storage() ? whole.storage().unsafeGetStorageImpl() : nullptr;
    if (whole.unsafeGetTensorImpl() != t.unsafeGetTensorImpl() && recorded.count(storage)) {
      op.outputs.push_back(recorded[storage]);
      continue;
    }
    std::string name = mode_ == CaptureMode::kStats ? "" : absl::StrCat("recv/", ids_.next_id());
    op.outputs.push_back(NewTensor(whole, static_cast<int64_t>(op.seq), std::move(name), formats::Role::kReceived));
    recorded[storage] = op.outputs.back();
  }
  formats::ToOpEvent(c, op);  // the arguments; op.outputs are set above
  AppendOp(op);
}

bool OpTracer::CollectiveStart(const CollectiveCall& call, const std::vector<at::Tensor>& inputs, bool in_place) {
  ThreadState& st = State();
  st.collective.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_ || st.depth > 0 || st.untraced > 0) {
    if (in_place) {
      for (const at::Tensor& t : inputs) worker_.BeforeWrite(t);
    }
    return false;
  }
  st.collective = BeginCollective(call, inputs, in_place, st);
  return true;
}

bool OpTracer::CollectiveEnd(const CollectiveCall& call, const std::vector<at::Tensor>& outputs) {
  ThreadState& st = State();
  if (!st.collective) return false;
  const std::shared_ptr<PendingCollective> pending = std::move(st.collective);
  std::lock_guard<std::mutex> lock(mu_);
  EndCollective(*pending, outputs);
  return true;
}

std::string OpTracer::CollectiveFailed() {
  const std::shared_ptr<PendingCollective> pending = std::move(State().collective);
  Flush();
  // Not recorded (in the rollout, say): the module it ran in, from the scopes.
  return pending ? pending->event.module : PlaceOp(State()).module;
}

int64_t OpTracer::NextCollectiveInGroup(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  return group_calls_[group]++;
}

std::unique_ptr<at::ObserverContext> OpTracer::StartDispatched(const at::RecordFunction& fn, ThreadState& st) {
  absl::StatusOr<DispatchedCollective> read = ReadDispatchedCollective(fn.name(), fn.inputs());
  std::lock_guard<std::mutex> lock(mu_);
  RecordCompletedLocked();
  if (st.untraced > 0) {  // not recorded; what it writes may still be queued for the worker
    if (read.ok()) {
      for (const at::Tensor& t : read->outputs) worker_.BeforeWrite(t);
    }
    return nullptr;
  }
  if (!read.ok()) {
    // One whose transfer the recorder cannot see writes behind its back.
    if (absl::IsUnimplemented(read.status()) && enabled_) sink_->OnError(read.status());
    return nullptr;  // else it writes nothing the step reads, or torch refuses the call
  }
  CollectiveCall& call = read->call;
  const auto named = group_names_.find(call.group);
  call.group = named != group_names_.end() ? named->second : absl::StrCat("c10d:", call.group);
  call.seq = group_calls_[call.group]++;  // counted outside steps too, as every rank does
  std::shared_ptr<PendingCollective> pending;
  if (enabled_) {
    pending = BeginCollective(call, read->inputs, read->in_place, st);
    pending->outputs = std::move(read->outputs);
  } else {  // outside a step: only a failure is reported, with its module
    pending = std::make_shared<PendingCollective>();
    pending->call = call;
    pending->event.module = PlaceOp(st).module;
    pending->recorded = false;
  }
  if (!read->in_place) {
    for (const at::Tensor& t : pending->recorded ? pending->outputs : read->outputs) worker_.BeforeWrite(t);
  }
  auto ctx = std::make_unique<OpContext>();
  ctx->collective = std::move(pending);
  return ctx;
}

void OpTracer::LaunchDispatched(const at::RecordFunction& fn, std::shared_ptr<PendingCollective> pending) {
  if (fn.outputs().empty()) return;  // the op raised: torch reports it
  pending->future = FutureOfWork(fn.outputs());
  if (!pending->future) {
    if (pending->recorded) {
      sink_->OnError(absl::UnimplementedError(absl::StrCat(
          fn.name(), ": its Work has no future, so the recorder cannot tell when what arrived exists; ",
          formats::DescribeCollective(CollectiveOpOf(pending->call), pending->event.module), " is not recorded")));
    }
    return;
  }
  // Taken before another thread can see the pending.
  const c10::intrusive_ptr<c10::ivalue::Future> future = pending->future;
  if (pending->recorded) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.push_back(pending);
    }
    Persist();  // the ops before it, durable before this rank waits in it
  }
  future->addCallback([live = live_, pending = std::move(pending)](c10::ivalue::Future& done) {
    at::DisableRecordFunctionGuard untraced;  // what the recorder runs here is not the program's
    std::lock_guard<std::mutex> lock(live->mu);
    if (live->tracer == nullptr) return;
    // Nothing may escape into the transport's thread: the future does not catch.
    try {
      if (done.hasError()) {
        const std::string why = done.tryRetrieveErrorMessage();
        live->tracer->CollectiveArrived(*pending, &why);
      } else {
        live->tracer->CollectiveArrived(*pending, nullptr);
      }
    } catch (const std::exception& e) {
      live->tracer->CollectiveCallbackFailed(e.what());
    }
  });
}

bool OpTracer::ArriveLocked(PendingCollective& pending, bool ok) {
  if (pending.arrived) return false;
  pending.arrived = true;
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [&](const std::shared_ptr<PendingCollective>& p) { return p.get() == &pending; }),
                   in_flight_.end());
  const bool in_step = pending.recorded && enabled_ && step_ == pending.step;
  if (in_step && ok) EndCollective(pending, pending.outputs);
  // Its outputs and future stay with the pending. Its last reference is the
  // future's callback (a completed future has handed its callbacks out, so
  // it holds no cycle), the op's context or LaunchDispatched's own, and
  // drops outside mu_ (in_flight_'s never outlives the callback's): dropping
  // the last reference to a tensor the program has let go of takes the GIL
  // (torch's PyInterpreter decref), which a thread waiting on mu_ may hold.
  return in_step;
}

void OpTracer::RecordCompletedLocked() {
  if (in_flight_.empty()) return;
  const std::vector<std::shared_ptr<PendingCollective>> flying = in_flight_;  // ArriveLocked erases
  for (const std::shared_ptr<PendingCollective>& p : flying) {
    // A failed one is left to its callback, which reports why.
    if (p->future && p->future->completed() && !p->future->hasError()) ArriveLocked(*p, true);
  }
}

void OpTracer::CollectiveArrived(PendingCollective& pending, const std::string* error) {
  bool in_step = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_step = ArriveLocked(pending, error == nullptr);
  }
  // A failure is reported in a step or out of it (the rank waited in it).
  if (error != nullptr) sink_->OnCollectiveFailed(pending.call, pending.event.module, *error);
  if (in_step) Persist();
}

void OpTracer::CollectiveCallbackFailed(const std::string& why) {
  sink_->OnError(absl::InternalError(absl::StrCat("recording a collective's arrival: ", why)));
}

void OpTracer::Persist() {
  Flush();
  sink_->Persist();
}

}  // namespace moerr::recorder
