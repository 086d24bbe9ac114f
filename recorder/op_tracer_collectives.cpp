// OpTracer's collectives (op_tracer.h, CollectiveStart): a collective is no
// ATen op, so no RecordFunction callback sees it; the process group calls
// the recorder around it instead (hooks/collective_hook.h).
#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "recorder/op_tracer.h"
#include "recorder/thread_state.h"

namespace moerr::recorder {

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
  st.collective = TakeScratch();
  formats::OpEvent& op = st.collective->op;
  const Placement where = PlaceOp(st);
  op = formats::OpEvent();
  op.seq = next_seq_++;
  op.thread = st.thread;
  PlaceEvent(where, op);
  formats::CollectiveOp& c = st.collective_op;
  c = formats::CollectiveOp();
  c.kind = call.kind;
  c.group = call.group;
  c.seq = call.seq;
  c.group_rank = call.group_rank;
  c.group_size = call.group_size;
  c.root = call.root;
  c.send_rows = call.send_rows;
  c.recv_rows = call.recv_rows;
  const ArgUse use{where.in_optimizer, where.in_batch, where.phase == formats::Phase::kBackward, false};
  for (const at::Tensor& t : inputs) {
    c.inputs.push_back(InputId(t, use));
    const std::vector<uint64_t> hashes = SliceHashes(t, call.send_rows);
    c.send_hashes.insert(c.send_hashes.end(), hashes.begin(), hashes.end());
  }
  // What the transfer overwrites must be read first (the inputs just named included).
  if (in_place) {
    for (const at::Tensor& t : inputs) worker_.BeforeWrite(t);
  }
  return true;
}

bool OpTracer::CollectiveEnd(const CollectiveCall& call, const std::vector<at::Tensor>& outputs) {
  ThreadState& st = State();
  if (!st.collective) return false;
  std::unique_ptr<OpScratch> scratch = std::move(st.collective);
  formats::OpEvent& op = scratch->op;
  formats::CollectiveOp& c = st.collective_op;
  std::lock_guard<std::mutex> lock(mu_);
  for (const at::Tensor& t : outputs) {
    // Written by the transport, not by an ATen op: a new version, so that
    // whatever reads it next reads this op's output.
    if (t.unsafeGetTensorImpl()->version_counter().enabled()) t.unsafeGetTensorImpl()->bump_version();
    const std::vector<uint64_t> hashes = SliceHashes(t, call.recv_rows);
    c.recv_hashes.insert(c.recv_hashes.end(), hashes.begin(), hashes.end());
    std::string name = mode_ == CaptureMode::kStats ? "" : absl::StrCat("recv/", ids_.next_id());
    op.outputs.push_back(NewTensor(t, static_cast<int64_t>(op.seq), std::move(name), formats::Role::kReceived));
  }
  formats::ToOpEvent(c, op);  // the arguments; op.outputs are set above
  AppendOp(op);
  if (ScratchPool().size() < 8) ScratchPool().push_back(std::move(scratch));
  return true;
}

std::string OpTracer::CollectiveFailed() {
  std::unique_ptr<OpScratch> pending = std::move(State().collective);
  Flush();
  // Not recorded (in the rollout, say): the module it ran in, from the scopes.
  return pending ? pending->op.module : PlaceOp(State()).module;
}

}  // namespace moerr::recorder
