#include "recorder/op_tracer.h"

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/function_schema.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "recorder/dispatched_collective.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/thread_state.h"
#include "support/check.h"
#include "support/enum_table.h"

namespace moerr::recorder {

namespace {

std::atomic<OpTracer*> g_tracer{nullptr};
// Counts the tracers made; each thread's state belongs to one (State()).
std::atomic<uint64_t> g_generation{0};


constexpr const char kEvaluateFunction[] = "autograd::engine::evaluate_function";
// Ops inside a user scope of this name are not recorded (op_tracer.h).
constexpr const char kUntracedScope[] = "generate";
// Tensor bytes the worker may hold before the traced thread waits for it.
constexpr size_t kWorkerBytes = size_t{1} << 30;

std::unique_ptr<at::ObserverContext> StartTrampoline(const at::RecordFunction& fn) {
  OpTracer* t = g_tracer.load(std::memory_order_acquire);
  return t ? t->OnStart(fn) : nullptr;
}

void EndTrampoline(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  OpTracer* t = g_tracer.load(std::memory_order_acquire);
  if (t) t->OnEnd(fn, ctx);
}

// Whether the tracer is the only observer this thread's ops call back. Then
// it may turn RecordFunction off on the thread for what it does not record
// (the ops an outermost op runs inside it, an untraced scope): LibTorch
// neither boxes their arguments nor calls back, which saves most of the
// callbacks of a step, and no other observer (a profiler) misses them.
// Whoever turns it off turns it back on.
bool OnlyObserver() {
  const at::StepCallbacks callbacks = at::getStepCallbacks(at::RecordScope::FUNCTION);
  return callbacks.callbacks_.size() == 1 && callbacks.callbacks_[0].start_ == &StartTrampoline;
}

bool Contains(const std::vector<ThreadState::Scope>& scopes, const char* name) {
  return std::any_of(scopes.begin(), scopes.end(), [&](const ThreadState::Scope& s) { return s.name == name; });
}

// The innermost scope that names a module (not a phase marker).
const char* ModuleOf(const std::vector<ThreadState::Scope>& scopes) {
  for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
    if (it->name != "optimizer" && it->name != "batch") return it->name.c_str();
  }
  return "";
}

// The device type of an op's first tensor argument ("cpu", "cuda", ...), or
// "" when it has none; from a table, so naming it allocates nothing.
const std::string& DeviceOf(const at::RecordFunction& fn) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (int i = 0; i < static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES); ++i) {
      n.push_back(c10::DeviceTypeName(static_cast<c10::DeviceType>(i), /*lower_case=*/true));
    }
    return n;
  }();
  static const std::string none;
  for (const c10::IValue& v : fn.inputs()) {
    const at::Tensor* t = nullptr;
    if (v.isTensor()) {
      t = &v.toTensor();
    } else if (v.isTensorList() && !v.toListRef().empty()) {
      t = &v.toListRef()[0].toTensor();
    }
    if (t != nullptr && t->defined()) return names[static_cast<size_t>(t->device().type())];
  }
  return none;
}

bool IsRandomOp(absl::string_view name) {
  for (const char* r : {"rand", "normal", "bernoulli", "multinomial", "dropout", "uniform", "exponential", "poisson",
                        "cauchy", "geometric", "log_normal"}) {
    if (absl::StrContains(name, r)) return true;
  }
  return false;
}

// An autograd node starts: its ops are outermost ops of their own.
void EnterNode(const at::RecordFunction& fn, ThreadState& st) {
  if (!st.evaluating.empty() && st.evaluating.back() < 0) st.evaluating.back() = fn.seqNr();
  st.backward.emplace_back(fn.seqNr(), st.depth);
  st.depth = 0;
}

// aten::_backward, or a named record that is no dispatcher op: not recorded,
// but what runs inside the engine's records is backward work.
std::unique_ptr<at::ObserverContext> EnterTransparent(const at::RecordFunction& fn, bool backward_call,
                                                      ThreadState& st) {
  auto ctx = std::make_unique<OpContext>();
  ctx->transparent = true;
  ctx->backward = backward_call || std::strncmp(fn.name(), kEvaluateFunction, sizeof(kEvaluateFunction) - 1) == 0;
  st.in_backward_call += ctx->backward;
  if (ctx->backward && !backward_call) st.evaluating.push_back(-1);  // the node's number comes with it
  return ctx;
}

// Whether this thread is a process group's worker (ThreadState::transport),
// by the name Gloo gives it (ProcessGroupGloo::runLoop).
bool IsTransportThread() {
  char name[16] = {};
  return pthread_getname_np(pthread_self(), name, sizeof(name)) == 0 && absl::StartsWith(name, "pt_gloo");
}

}  // namespace

OpContext::~OpContext() {
  if (!scratch) return;
  scratch->written.clear();  // drops the references now
  if (ScratchPool().size() < 8) ScratchPool().push_back(std::move(scratch));
}

ThreadState& State() {
  static std::atomic<uint32_t> next_thread{0};
  thread_local ThreadState state = [] {
    ThreadState s;
    s.thread = next_thread++;
    s.transport = IsTransportThread();
    return s;
  }();
  const uint64_t generation = g_generation.load(std::memory_order_relaxed);
  if (state.generation != generation) {
    const uint32_t thread = state.thread;
    const bool transport = state.transport;
    state = ThreadState();
    state.thread = thread;
    state.transport = transport;
    state.generation = generation;
  }
  return state;
}

std::vector<std::unique_ptr<OpScratch>>& ScratchPool() {
  thread_local std::vector<std::unique_ptr<OpScratch>> pool;
  return pool;
}

std::unique_ptr<OpScratch> TakeScratch() {
  std::vector<std::unique_ptr<OpScratch>>& pool = ScratchPool();
  if (pool.empty()) return std::make_unique<OpScratch>();
  std::unique_ptr<OpScratch> s = std::move(pool.back());
  pool.pop_back();
  return s;
}

constexpr EnumName<CaptureMode> kCaptureModes[] = {
    {CaptureMode::kStats, "stats"}, {CaptureMode::kReplayable, "replayable"}, {CaptureMode::kFull, "full"}};

absl::StatusOr<CaptureMode> ParseCaptureMode(const std::string& name) {
  return ParseEnum(kCaptureModes, "capture mode", name);
}

std::string CaptureModeName(CaptureMode mode) { return std::string(EnumNameOf(kCaptureModes, mode)); }

OpTracer::OpTracer(CaptureMode mode, TraceSink* sink, size_t batch_ops)
    : mode_(mode),
      batch_ops_(std::max<size_t>(1, batch_ops)),
      sink_(sink),
      live_(std::make_shared<Liveness>()),
      worker_(sink, kWorkerBytes) {
  live_->tracer = this;
  OpTracer* expected = nullptr;
  MOERR_CHECK(g_tracer.compare_exchange_strong(expected, this)) << "only one OpTracer may be active";
  g_generation.fetch_add(1, std::memory_order_relaxed);
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&StartTrampoline, &EndTrampoline)
                                      .needsInputs(true)
                                      .needsOutputs(true)
                                      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                               at::RecordScope::USER_SCOPE}));
}

OpTracer::~OpTracer() {
  {
    // A collective still in flight finds no tracer when it completes; one
    // being recorded now finishes first.
    std::lock_guard<std::mutex> lock(live_->mu);
    live_->tracer = nullptr;
  }
  at::removeCallback(handle_);
  g_tracer.store(nullptr, std::memory_order_release);
  Flush();
}

void OpTracer::set_enabled(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!on) RecordCompletedLocked();  // what the step waited for is its own
  enabled_ = on;
}

void OpTracer::NewStep() {
  std::lock_guard<std::mutex> lock(mu_);
  FlushLocked();
  worker_.NewStep();
  ++step_;
  in_flight_.clear();  // an earlier step's, never waited for: not this step's
  node_ranges_.clear();
  // A step is replayed on its own: whatever it reads from an earlier step is
  // a leaf of this one.
  ids_.NewStep();
}

void OpTracer::NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, t] : named) ids_.SetName(t, name);
}

void OpTracer::Flush() {
  // Drained under the lock: a collective's callback traces from another
  // thread, and the worker takes one producer at a time.
  std::lock_guard<std::mutex> lock(mu_);
  FlushLocked();
  worker_.Drain();
}

void OpTracer::FlushLocked() {
  if (pending_ops_ == 0 && pending_tensors_ == 0) return;
  pending_.ops.resize(pending_ops_);  // drops what a spare batch had beyond them
  pending_.tensors.resize(pending_tensors_);
  worker_.AddBatch(std::move(pending_));
  pending_ = worker_.SpareBatch();
  pending_ops_ = pending_tensors_ = 0;
}

uint64_t OpTracer::ops_recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

const OpTracer::SchemaInfo& OpTracer::InfoOf(const at::RecordFunction& fn) {
  auto [it, inserted] = schema_info_.try_emplace(fn.name());
  if (inserted) {
    it->second.random = IsRandomOp(fn.name());
    it->second.external = !absl::StartsWith(fn.name(), "aten::");
    it->second.allocates_uninitialised = formats::AllocatesUninitialised(fn.name());
    if (const c10::optional<c10::FunctionSchema> schema = fn.operator_schema()) {
      for (const c10::Argument& arg : schema->arguments()) {
        it->second.written.push_back(arg.alias_info() != nullptr && arg.alias_info()->isWrite());
      }
      it->second.returns_nothing = schema->returns().empty();
    }
  }
  return it->second;
}

void OpTracer::WaitBeforeWrites(const at::RecordFunction& fn, const SchemaInfo& info,
                                std::vector<at::Tensor>* written) {
  const auto inputs = fn.inputs();
  const std::vector<bool>& writes = info.written;
  for (size_t i = 0; i < inputs.size() && i < writes.size(); ++i) {
    if (!writes[i]) continue;
    if (inputs[i].isTensor()) {
      worker_.BeforeWrite(inputs[i].toTensor());
      if (written != nullptr) written->push_back(inputs[i].toTensor());
    } else if (inputs[i].isTensorList()) {
      // From the last: the worker reads the list's queued values from the
      // first, so the two threads share them and meet once.
      const c10::List<at::Tensor> list = inputs[i].toTensorList();
      for (size_t j = list.size(); j-- > 0;) worker_.BeforeWrite(list.get(j));
      if (written != nullptr) written->insert(written->end(), list.begin(), list.end());
    }
  }
}

OpTracer::Placement OpTracer::PlaceOp(const ThreadState& st) {
  Placement where;
  where.in_optimizer = Contains(st.scopes, "optimizer");
  where.in_batch = Contains(st.scopes, "batch");
  if (where.in_optimizer) {
    where.phase = formats::Phase::kOptimizer;
  } else if (!st.backward.empty() || st.in_backward_call > 0) {
    where.phase = formats::Phase::kBackward;
    where.node = !st.backward.empty()     ? st.backward.back().first
                 : !st.evaluating.empty() ? st.evaluating.back()
                                          : -1;
  } else {
    where.phase = formats::Phase::kForward;
    where.module = ModuleOf(st.scopes);
  }
  return where;
}

void OpTracer::SilenceUntracedScope() {
  // Drained, the worker has nothing left that an op inside could overwrite:
  // the scope's ops need no callbacks at all.
  std::lock_guard<std::mutex> lock(mu_);
  worker_.Drain();
  at::enableRecordFunction(false);
}

void OpTracer::AttributeToForward(int64_t node, formats::OpEvent& op) const {
  auto it = std::upper_bound(node_ranges_.begin(), node_ranges_.end(), node,
                             [](int64_t n, const NodeRange& r) { return n < r.begin; });
  if (it != node_ranges_.begin() && node < std::prev(it)->end) {
    op.forward_seq = static_cast<int64_t>(std::prev(it)->seq);
    op.module.assign(*std::prev(it)->module);
  } else if (it != node_ranges_.end() && it->begin == node + 1) {
    op.module.assign(*it->module);  // a custom Function's node: the module its forward ran in
  }
}

void OpTracer::BeginEvent(const at::RecordFunction& fn, const c10::OperatorName& name, uint32_t thread,
                          const Placement& where, OpScratch& scratch) {
  scratch.sources.clear();
  scratch.seq_begin = -1;
  // A reused event: every field is set here or by RecordInputs and OnEnd.
  formats::OpEvent& op = scratch.op;
  op.seq = next_seq_++;
  op.thread = thread;
  op.name.assign(name.name);
  op.overload.assign(name.overload_name);
  op.module.clear();
  op.sequence_nr = fn.seqNr();
  op.forward_seq = -1;
  op.outputs.clear();
  op.autocast = -1;
  op.device.assign(DeviceOf(fn));
  if (at::autocast::is_autocast_enabled(at::kCPU)) {
    auto dtype = moerr::recorder::ToDType(at::autocast::get_autocast_dtype(at::kCPU));
    op.autocast = dtype.ok() ? static_cast<int8_t>(*dtype) : -1;
  }
  PlaceEvent(where, op);
  if (where.phase == formats::Phase::kForward) scratch.seq_begin = static_cast<int64_t>(at::sequence_number::peek());
}

void OpTracer::PlaceEvent(const Placement& where, formats::OpEvent& op) const {
  op.phase = where.phase;
  if (where.phase == formats::Phase::kOptimizer) {
    op.module.assign("optimizer");
  } else if (where.phase == formats::Phase::kBackward) {
    AttributeToForward(where.node, op);
  } else {
    op.module.assign(where.module);
  }
}

void OpTracer::RecordInputs(const at::RecordFunction& fn, const Placement& where, OpScratch& scratch) {
  // An argument the schema marks as written (in place, out=) is not read:
  // an `empty` buffer there is not a leaf (see InputId).
  const SchemaInfo& info = InfoOf(fn);
  ArgUse use{where.in_optimizer, where.in_batch, where.phase == formats::Phase::kBackward};
  const auto inputs = fn.inputs();
  formats::OpEvent& op = scratch.op;
  op.args.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    use.written = i < info.written.size() && info.written[i];
    ToArg(inputs[i], use, scratch.sources, op.args[i]);
  }
  // The worker may still have to read what this op overwrites (the leaves
  // just named included). An op that returns nothing has what it wrote as
  // its outputs.
  WaitBeforeWrites(fn, info, info.returns_nothing ? &scratch.written : nullptr);
}

std::unique_ptr<at::ObserverContext> OpTracer::OnStart(const at::RecordFunction& fn) {
  ThreadState& st = State();
  if (st.transport) return nullptr;
  switch (fn.scope()) {
    case at::RecordScope::USER_SCOPE:
      st.scopes.push_back({fn.name(), fn.name()});
      if (std::strcmp(fn.name(), kUntracedScope) == 0 && st.untraced++ == 0 && OnlyObserver()) {
        SilenceUntracedScope();
        st.silenced_scope = true;
      }
      return nullptr;
    case at::RecordScope::BACKWARD_FUNCTION:
      EnterNode(fn, st);
      return nullptr;
    default: break;
  }
  if (st.depth > 0) {  // only the outermost op of a thread is recorded
    ++st.depth;
    return nullptr;
  }
  const bool backward_call = std::strcmp(fn.name(), "aten::_backward") == 0;
  const c10::optional<c10::OperatorName> name = fn.operator_name();
  if (backward_call || !name) return EnterTransparent(fn, backward_call, st);
  ++st.depth;
  st.silenced_op = OnlyObserver();
  if (st.silenced_op) at::enableRecordFunction(false);
  if (IsDispatchedCollective(fn.name())) return StartDispatched(fn, st);
  std::lock_guard<std::mutex> lock(mu_);
  RecordCompletedLocked();
  if (st.untraced > 0) {
    WaitBeforeWrites(fn, InfoOf(fn));  // not recorded, but it may overwrite what the worker is to read
    return nullptr;
  }
  if (!enabled_) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  ctx->scratch = TakeScratch();
  const Placement where = PlaceOp(st);
  BeginEvent(fn, *name, st.thread, where, *ctx->scratch);
  RecordInputs(fn, where, *ctx->scratch);
  return ctx;
}

void OpTracer::OnEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  ThreadState& st = State();
  if (st.transport) return;
  switch (fn.scope()) {
    case at::RecordScope::USER_SCOPE: {
      // The scope this record entered, found by its name's address: scopes
      // may end out of order (a non-reentrant checkpoint stops its
      // recomputation by an exception, and the scopes its modules entered
      // end later, when their records are dropped). One entered before the
      // tracer existed is not there.
      const void* id = fn.name();
      const auto it = std::find_if(st.scopes.rbegin(), st.scopes.rend(),
                                   [&](const ThreadState::Scope& s) { return s.id == id; });
      if (it == st.scopes.rend()) return;
      if (it->name == kUntracedScope && --st.untraced == 0 && st.silenced_scope) {
        at::enableRecordFunction(true);
        st.silenced_scope = false;
      }
      st.scopes.erase(std::next(it).base());
      return;
    }
    case at::RecordScope::BACKWARD_FUNCTION:
      if (!st.backward.empty()) {
        st.depth = st.backward.back().second;
        st.backward.pop_back();
      }
      return;
    default: break;
  }
  auto* op_ctx = static_cast<OpContext*>(ctx);
  if (op_ctx != nullptr && op_ctx->transparent) {
    st.in_backward_call -= op_ctx->backward;
    if (op_ctx->backward && std::strcmp(fn.name(), "aten::_backward") != 0 && !st.evaluating.empty()) {
      st.evaluating.pop_back();
    }
    return;
  }
  if (--st.depth == 0 && st.silenced_op) {
    at::enableRecordFunction(true);
    st.silenced_op = false;
  }
  if (ctx == nullptr) return;
  if (op_ctx->collective) return LaunchDispatched(fn, std::move(op_ctx->collective));
  OpScratch& scratch = *op_ctx->scratch;
  formats::OpEvent& op = scratch.op;
  const int64_t producer = static_cast<int64_t>(op.seq);
  std::lock_guard<std::mutex> lock(mu_);
  const SchemaInfo& info = InfoOf(fn);
  const auto output = [&](const at::Tensor& t) { op.outputs.push_back(OutputId(t, producer, info, scratch.sources)); };
  for (const at::Tensor& t : scratch.written) output(t);
  for (const c10::IValue& v : fn.outputs()) {
    if (v.isTensor() && v.toTensor().defined()) {
      output(v.toTensor());
    } else if (v.isTensorList()) {
      for (const c10::IValue& e : v.toListRef()) output(e.toTensor());
    } else {
      op.outputs.push_back(0);
    }
  }
  if (scratch.seq_begin >= 0) {
    const int64_t end = static_cast<int64_t>(at::sequence_number::peek());
    // An op that made nodes; or the first op after a gap in the numbers: a
    // node something unrecorded made (a custom autograd Function, whose
    // forward runs this op without grad), which gets this op's module.
    const int64_t last = node_ranges_.empty() ? -1 : node_ranges_.back().end;
    if (end > scratch.seq_begin || scratch.seq_begin > last) {
      node_ranges_.push_back(NodeRange{scratch.seq_begin, end, op.seq, &*modules_.insert(op.module).first});
    }
  }
  AppendOp(op);
}

void OpTracer::AppendOp(formats::OpEvent& op) {
  // Into the batch by swapping with the slot's old event, whose capacity the
  // scratch keeps for the next op.
  if (pending_ops_ < pending_.ops.size()) {
    std::swap(pending_.ops[pending_ops_], op);
  } else {
    pending_.ops.push_back(std::move(op));
  }
  ++pending_ops_;
  ++recorded_;
  if (eager_.load(std::memory_order_relaxed)) {
    FlushLocked();
    worker_.Drain();  // the sink has it (and has written it) before the next op runs
  } else if (pending_ops_ >= batch_ops_) {
    FlushLocked();
  }
}

}  // namespace moerr::recorder
