#include "recorder/recorder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <signal.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/annotations.h"
#include "formats/frame.h"
#include "formats/json_number.h"
#include "formats/trace.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::recorder {
namespace {

// The crash handler's state: prepared "crash" record frames, one per signal,
// and the descriptor to append them to. Plain data, read in a signal handler.
constexpr int kSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE};
struct CrashFrames {
  std::atomic<int> fd{-1};
  std::vector<std::byte> frame[4];
  struct sigaction previous[4];
};
CrashFrames g_crash;

void OnFatalSignal(int sig) {
  const int fd = g_crash.fd.load();
  for (int i = 0; i < 4; ++i) {
    if (kSignals[i] != sig) continue;
    if (fd >= 0) (void)!::write(fd, g_crash.frame[i].data(), g_crash.frame[i].size());
    ::sigaction(sig, &g_crash.previous[i], nullptr);
  }
  ::raise(sig);
}

std::vector<std::byte> CrashFrame(int sig) {
  formats::Record record;
  record.kind = static_cast<uint16_t>(formats::RecordKind::kAnnotation);
  record.key = "crash";
  record.value = llvm::json::Object{{"signal", sig}, {"name", sig == SIGSEGV   ? "SIGSEGV"
                                                              : sig == SIGABRT ? "SIGABRT"
                                                              : sig == SIGBUS  ? "SIGBUS"
                                                                               : "SIGFPE"}};
  return formats::EncodeFrame(formats::FrameKind::kRecord, 0, formats::EncodeRecord(record));
}

void InstallCrashHandler(int fd) {
  for (int i = 0; i < 4; ++i) {
    g_crash.frame[i] = CrashFrame(kSignals[i]);
    struct sigaction action {};
    action.sa_handler = &OnFatalSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    ::sigaction(kSignals[i], &action, &g_crash.previous[i]);
  }
  g_crash.fd.store(fd);
}

// Points an installed handler at another file (the ring's slot of the step
// in progress, or the bundle again).
void RetargetCrashHandler(int fd) {
  int installed = g_crash.fd.load();
  if (installed >= 0 && fd >= 0) g_crash.fd.compare_exchange_strong(installed, fd);
}

// kAnomaly: ops per batch handed to the ring's file. A process killed inside
// a step loses at most this many ops' records (docs/TRACE.md).
constexpr size_t kRingBatchOps = 256;

void RemoveCrashHandler() {
  if (g_crash.fd.exchange(-1) < 0) return;
  for (int i = 0; i < 4; ++i) ::sigaction(kSignals[i], &g_crash.previous[i], nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Recorder>> Recorder::Start(RecordOptions options) {
  if (options.ring_steps < 1) return absl::InvalidArgumentError("the anomaly ring must hold at least one step");
  if (options.first_step > options.last_step) return absl::InvalidArgumentError("step window is empty");
  auto rec = std::unique_ptr<Recorder>(new Recorder(options));
  MOERR_ASSIGN_OR_RETURN(rec->writer_, formats::BundleWriter::Create(
                                           options.path, formats::WriterOptions().set_overwrite(options.overwrite)));
  if (options.trigger == Trigger::kAnomaly) {
    MOERR_ASSIGN_OR_RETURN(rec->ring_, AnomalyRing::Create(options.path, options.ring_steps, options.overwrite));
  }
  const size_t batch_ops =
      options.trigger == Trigger::kAnomaly ? std::min(options.batch_ops, kRingBatchOps) : options.batch_ops;
  rec->tracer_ = std::make_unique<OpTracer>(options.mode, rec.get(), batch_ops);
  rec->tracer_->set_enabled(false);
  formats::Recording recording;
  recording.mode = std::string(CaptureModeName(options.mode));
  recording.trigger = options.trigger == Trigger::kAlways   ? "always"
                      : options.trigger == Trigger::kWindow ? "window"
                                                            : "anomaly";
  recording.libtorch = absl::StrFormat("%d.%d.%d", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  recording.threads = at::get_num_threads();
  recording.deterministic = static_cast<bool>(at::globalContext().deterministicAlgorithms());
  MOERR_RETURN_IF_ERROR(rec->writer_->Annotate(formats::kRecordingAnnotation, formats::ToJson(recording)));
  if (options.crash_handler) InstallCrashHandler(rec->writer_->crash_fd());
  return rec;
}

Recorder::Recorder(RecordOptions options)
    : options_(std::move(options)), trigger_(options_.spike_factor, options_.watches) {}

Recorder::~Recorder() {
  if (!stopped_) {
    if (absl::Status s = Stop(); !s.ok()) std::fprintf(stderr, "moerr: recorder: %s\n", std::string(s.message()).c_str());
  }
}

void Recorder::NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named) { tracer_->NameTensors(named); }

absl::Status Recorder::Emit(formats::Record record) {
  formats::BundleWriter* w = StepWriter();
  return w == nullptr ? absl::OkStatus() : w->AppendRecord(std::move(record));  // null: outside any step
}

absl::Status Recorder::EmitTensor(const std::string& name, formats::Role role, const at::Tensor& t) {
  formats::BundleWriter* w = StepWriter();
  if (w == nullptr) return absl::OkStatus();  // outside any step of the ring
  MOERR_ASSIGN_OR_RETURN(formats::TensorView view, ViewOf(t));  // holds `t` until written
  return w->PutTensor(name, role, step_, view);
}

void Recorder::OnOps(formats::OpBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!batch.ops.empty()) {
    const formats::OpEvent& last = batch.ops.back();
    step_ops_ += static_cast<int64_t>(batch.ops.size());
    last_op_ = formats::RaisedStep::LastOp{step_ops_ - 1, last.name, last.module};
  }
  if (!Streaming()) WatchFirstOverflow(batch);
  formats::BundleWriter* w = StepWriter();
  if (w == nullptr) return;
  formats::Record record;
  record.kind = static_cast<uint16_t>(formats::RecordKind::kOps);
  record.step = step_;
  // Encoded from the batch, which goes back to the tracer to refill.
  std::swap(record.ops, batch);
  absl::Status s = w->AppendRecord(record);
  std::swap(record.ops, batch);
  // After the step's first overflow each op reaches the file as it ends.
  if (s.ok() && first_overflow_) s = w->Flush();
  if (!s.ok() && failed_.ok()) failed_ = s;
}

void Recorder::WatchFirstOverflow(const formats::OpBatch& batch) {
  using K = formats::OpArg::Kind;
  for (const formats::TensorMeta& t : batch.tensors) {
    const formats::Fingerprint& f = t.fingerprint;
    if (f.nan + f.pos_inf + f.neg_inf > 0) nonfinite_ids_.insert(t.id);
  }
  if (first_overflow_ || nonfinite_ids_.empty()) return;
  for (const formats::OpEvent& op : batch.ops) {
    // Uninitialised memory (empty, empty_like, ...) may hold any bits: not
    // an overflow, as analysis/first_overflow judges it too.
    if (formats::AllocatesUninitialised(op.name)) continue;
    bool inputs_finite = true;
    for (const formats::OpArg& a : op.args) {
      if (a.kind == K::kTensor) inputs_finite &= !nonfinite_ids_.contains(static_cast<uint64_t>(a.i));
      if (a.kind == K::kTensors || a.kind == K::kOptionalTensors) {
        for (int64_t id : a.ints) inputs_finite &= id < 0 || !nonfinite_ids_.contains(static_cast<uint64_t>(id));
      }
      // A non-finite scalar is an input: masked_fill(scores, mask, -inf).
      if (a.kind == K::kFloat || a.kind == K::kWrappedFloat) inputs_finite &= std::isfinite(a.f);
      if (a.kind == K::kFloats) {
        for (double f : a.floats) inputs_finite &= std::isfinite(f);
      }
    }
    if (!inputs_finite) continue;
    for (uint64_t id : op.outputs) {
      if (id == 0 || !nonfinite_ids_.contains(id)) continue;
      first_overflow_ = op.seq;
      tracer_->set_eager(true);
      formats::Record record;
      record.kind = static_cast<uint16_t>(formats::RecordKind::kAnnotation);
      record.step = step_;
      record.key = "first_overflow";
      record.value = llvm::json::Object{{"seq", static_cast<int64_t>(op.seq)}, {"op", op.name}, {"module", op.module}};
      if (absl::Status s = Emit(std::move(record)); !s.ok() && failed_.ok()) failed_ = s;
      return;
    }
  }
}

void Recorder::OnTensorBytes(std::string name, formats::Role role, at::Tensor snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = EmitTensor(name, role, snapshot); !s.ok() && failed_.ok()) failed_ = s;
}

void Recorder::OnError(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.ok()) failed_ = std::move(status);
}

void Recorder::OnCollectiveStart(const CollectiveCall& call, const std::vector<at::Tensor>& inputs, bool in_place) {
  // Only what is recorded is flushed: the rollout's collectives are not.
  if (in_step_ && tracer_->CollectiveStart(call, inputs, in_place)) FlushToFile();
}

void Recorder::OnCollectiveEnd(const CollectiveCall& call, const std::vector<at::Tensor>& outputs) {
  if (in_step_ && tracer_->CollectiveEnd(call, outputs)) FlushToFile();
}

void Recorder::FlushToFile() {
  tracer_->Flush();
  Persist();
}

void Recorder::Persist() {
  // A rank may die or stall while it waits in a collective (it, or another):
  // the ops up to each collective reach the file (the bundle, or the ring's
  // slot), so salvage finds them.
  std::lock_guard<std::mutex> lock(mu_);
  formats::BundleWriter* w = StepWriter();
  if (w == nullptr) return;
  if (absl::Status s = w->Flush(); !s.ok() && failed_.ok()) failed_ = s;
}

void Recorder::OnCollectiveFailed(const CollectiveCall& call, const std::string& why) {
  if (stopped_) return;
  AnnotateFailedCollective(call, tracer_->CollectiveFailed(), why);
}

void Recorder::OnCollectiveFailed(const CollectiveCall& call, const std::string& module, const std::string& why) {
  AnnotateFailedCollective(call, module, why);
}

void Recorder::AnnotateFailedCollective(const CollectiveCall& call, const std::string& module,
                                        const std::string& why) {
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);  // on a collective's callback thread, beside the step's
    step = step_;
  }
  const formats::CollectiveFailed failed{call.kind, call.group, call.seq, step, module, why, call.group_rank};
  absl::Status s = Annotate(formats::kCollectiveFailedAnnotation, formats::ToJson(failed));
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = s;
  }
}

void Recorder::NameGroups(const std::vector<std::pair<std::string, std::string>>& names) {
  if (tracer_) tracer_->NameGroups(names);
}

int64_t Recorder::NextCollectiveInGroup(const std::string& group) {
  return tracer_ ? tracer_->NextCollectiveInGroup(group) : 0;
}

void Recorder::OnRouting(const RoutingEvent& e) {
  if (!in_step_) return;
  at::DisableRecordFunctionGuard no_record;  // our own ops are not the model's
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(micro_batch_.size()) <= e.layer) micro_batch_.resize(e.layer + 1, 0);
  formats::RoutingRecord r;
  r.layer = e.layer;
  r.micro_batch = micro_batch_[e.layer]++;
  const std::string prefix = absl::StrFormat("routing/L%d/mb%d/", r.layer, r.micro_batch);
  r.topk_ids = prefix + "topk_ids";
  r.topk_weights = prefix + "topk_weights";
  const at::Tensor ids = e.topk_ids.detach().to(at::kInt).contiguous();
  // Without logits (a router that does not expose them) the expert count is
  // what the ids show.
  const bool logits = e.logits.defined() && e.logits.dim() == 2;
  const int64_t experts = logits ? e.logits.size(1) : (e.topk_ids.numel() ? e.topk_ids.max().item<int64_t>() + 1 : 0);
  const at::Tensor counts = at::bincount(e.topk_ids.detach().reshape({-1}), {}, experts);
  r.token_counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
  absl::Status s = EmitTensor(r.topk_ids, formats::Role::kOther, ids);
  if (s.ok()) s = EmitTensor(r.topk_weights, formats::Role::kOther, e.topk_weights.detach().clone());
  if (s.ok() && options_.capture_logits && logits) {
    r.logits = prefix + "logits";
    s = EmitTensor(r.logits, formats::Role::kOther, e.logits.detach().clone());
  }
  formats::Record record;
  record.kind = static_cast<uint16_t>(formats::RecordKind::kRouting);
  record.step = step_;
  record.routing = std::move(r);
  if (s.ok()) s = Emit(std::move(record));
  if (!s.ok() && failed_.ok()) failed_ = s;
}

absl::Status Recorder::StepBegin(int64_t step) {
  MOERR_RETURN_IF_ERROR(failed_);
  MOERR_CHECK(!in_step_) << "StepBegin(" << step << ") inside step " << step_;
  const bool record = options_.trigger != Trigger::kWindow || (step >= options_.first_step && step <= options_.last_step);
  {
    std::lock_guard<std::mutex> lock(mu_);  // a collective's callback reads it (AnnotateFailedCollective)
    step_ = step;
  }
  micro_batch_.clear();
  last_op_.reset();
  step_ops_ = 0;
  if (!record) return absl::OkStatus();
  in_step_ = true;
  if (Streaming()) {
    std::lock_guard<std::mutex> lock(mu_);  // a collective's callback may flush the writer (Persist)
    MOERR_RETURN_IF_ERROR(writer_->BeginStep(step));
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      nonfinite_ids_.clear();
      first_overflow_.reset();
      MOERR_RETURN_IF_ERROR(ring_->Begin(step));
    }
    tracer_->set_eager(false);
    RetargetCrashHandler(ring_->crash_fd());  // a fatal signal inside the step lands in its slot
  }
  {
    at::DisableRecordFunctionGuard no_record;
    const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    std::lock_guard<std::mutex> lock(mu_);  // a collective's callback may write too
    MOERR_RETURN_IF_ERROR(EmitTensor("rng/cpu", formats::Role::kRng, rng));
  }
  tracer_->NewStep();
  tracer_->set_enabled(true);
  return absl::OkStatus();
}

absl::Status Recorder::AnnotateStep(const std::string& key, llvm::json::Value value) {
  formats::Record record;
  record.kind = static_cast<uint16_t>(formats::RecordKind::kAnnotation);
  record.step = step_;
  record.key = key;
  record.value = std::move(value);
  std::lock_guard<std::mutex> lock(mu_);
  return Emit(std::move(record));
}

absl::Status Recorder::Annotate(const std::string& key, llvm::json::Value value) {
  std::lock_guard<std::mutex> lock(mu_);  // the tracer's worker writes op batches
  return writer_->Annotate(key, std::move(value));
}

absl::Status Recorder::StepEnd(int64_t step, StepOutcome outcome) {
  MOERR_CHECK(step == step_) << "StepEnd(" << step << ") but the step is " << step_;
  tracer_->set_enabled(false);
  tracer_->Flush();
  MOERR_RETURN_IF_ERROR(failed_);
  if (!in_step_) return absl::OkStatus();
  if (!outcome.metrics.empty()) {
    llvm::json::Object metrics;
    for (const auto& [name, value] : outcome.metrics) metrics[name] = formats::JsonNumberOrName(value);
    MOERR_RETURN_IF_ERROR(AnnotateStep(formats::kOutcomeAnnotation, std::move(metrics)));
  }
  in_step_ = false;
  if (Streaming()) {
    written_.push_back(step);
    std::lock_guard<std::mutex> lock(mu_);
    return writer_->EndStep(step);
  }
  std::optional<std::string> why = trigger_.Judge(outcome);  // every step: the medians need its values
  if (!why && first_overflow_) why = absl::StrFormat("the first non-finite value, at op %d", *first_overflow_);
  if (!why) {
    RetargetCrashHandler(writer_->crash_fd());
    std::lock_guard<std::mutex> lock(mu_);
    return ring_->End(/*complete=*/true);
  }
  return KeepRing(llvm::json::Object{{"loss", formats::JsonNumberOrName(outcome.loss)},
                                     {"grad_norm", formats::JsonNumberOrName(outcome.grad_norm)},
                                     {"reason", *why}},
                  /*complete=*/true);
}

absl::Status Recorder::StepRaised(int64_t step, formats::RaisedStep raised) {
  MOERR_CHECK(step == step_) << "StepRaised(" << step << ") but the step is " << step_;
  tracer_->set_enabled(false);
  tracer_->Flush();
  if (!in_step_) return failed_;
  in_step_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    raised.last_op = last_op_;
  }
  const std::string headline = raised.Headline();
  // Written even after a failed capture: the exception is the first fact.
  const absl::Status annotated = AnnotateStep(formats::kRaisedAnnotation, formats::toJSON(raised));
  MOERR_RETURN_IF_ERROR(failed_);
  MOERR_RETURN_IF_ERROR(annotated);
  if (Streaming()) {
    std::lock_guard<std::mutex> lock(mu_);
    return writer_->Checkpoint();  // in the file now, though not complete
  }
  return KeepRing(llvm::json::Object{{"raised", raised.type}, {"reason", "raised " + headline}}, /*complete=*/false);
}

absl::Status Recorder::KeepRing(llvm::json::Object why, bool complete) {
  if (anomaly_step_ < 0) anomaly_step_ = step_;
  MOERR_RETURN_IF_ERROR(AnnotateStep(formats::kAnomalyAnnotation, std::move(why)));
  RetargetCrashHandler(writer_->crash_fd());
  std::lock_guard<std::mutex> lock(mu_);
  MOERR_RETURN_IF_ERROR(ring_->End(complete));
  MOERR_ASSIGN_OR_RETURN(const std::vector<int64_t> kept, ring_->KeepInto(*writer_));
  written_.insert(written_.end(), kept.begin(), kept.end());
  return absl::OkStatus();
}

absl::Status Recorder::Stop() {
  if (stopped_) return absl::OkStatus();
  stopped_ = true;
  if (!tracer_) return absl::OkStatus();  // Start failed before tracing began
  RemoveCrashHandler();
  ops_at_stop_ = tracer_->ops_recorded();
  tracer_.reset();  // flushes into the ring or the writer
  MOERR_RETURN_IF_ERROR(failed_);
  if (ring_) {
    // A step the recording stopped inside did not end (an error ended the
    // program's loop): kept, as a raised one is. Otherwise the ring held
    // nothing anomalous.
    if (in_step_) {
      in_step_ = false;
      MOERR_RETURN_IF_ERROR(KeepRing(
          llvm::json::Object{{"reason", absl::StrFormat("the recording stopped inside step %d", step_)}},
          /*complete=*/false));
    }
    ring_->Discard();
  }
  return writer_->Close();
}

}  // namespace moerr::recorder
