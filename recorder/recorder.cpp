#include "recorder/recorder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <signal.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "formats/frame.h"
#include "formats/json_number.h"
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
  rec->tracer_ = std::make_unique<OpTracer>(options.mode, rec.get(), options.batch_ops);
  rec->tracer_->set_enabled(false);
  MOERR_RETURN_IF_ERROR(rec->writer_->Annotate(
      "recording", llvm::json::Object{{"mode", CaptureModeName(options.mode)},
                                      {"trigger", options.trigger == Trigger::kAlways   ? "always"
                                                  : options.trigger == Trigger::kWindow ? "window"
                                                                                        : "anomaly"},
                                      {"libtorch", absl::StrFormat("%d.%d.%d", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH)},
                                      {"threads", at::get_num_threads()},
                                      {"deterministic", static_cast<bool>(at::globalContext().deterministicAlgorithms())}}));
  if (options.crash_handler) InstallCrashHandler(rec->writer_->crash_fd());
  return rec;
}

Recorder::Recorder(RecordOptions options) : options_(std::move(options)) {}

Recorder::~Recorder() {
  if (!stopped_) {
    if (absl::Status s = Stop(); !s.ok()) std::fprintf(stderr, "moerr: recorder: %s\n", std::string(s.message()).c_str());
  }
}

void Recorder::NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named) { tracer_->NameTensors(named); }

absl::Status Recorder::Emit(formats::Record record) {
  if (Streaming()) return writer_->AppendRecord(std::move(record));
  if (!ring_.empty()) ring_.back().records.push_back(std::move(record));  // else: outside any step
  return absl::OkStatus();
}

absl::Status Recorder::EmitTensor(const std::string& name, formats::Role role, const at::Tensor& t) {
  if (!Streaming()) {
    if (!ring_.empty()) ring_.back().tensors.emplace_back(name, role, t);  // else: outside any step
    return absl::OkStatus();
  }
  MOERR_ASSIGN_OR_RETURN(formats::TensorView view, ViewOf(t));  // holds `t` until written
  return writer_->PutTensor(name, role, step_, view);
}

void Recorder::OnOps(formats::OpBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  formats::Record record;
  record.kind = static_cast<uint16_t>(formats::RecordKind::kOps);
  record.step = step_;
  // Streaming, the batch is encoded and left to the tracer to refill; the
  // anomaly ring keeps it.
  std::swap(record.ops, batch);
  absl::Status s = Streaming() ? writer_->AppendRecord(record) : Emit(std::move(record));
  if (Streaming()) std::swap(record.ops, batch);
  if (!s.ok() && failed_.ok()) failed_ = s;
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
  if (!Streaming()) return;
  // A rank may die or stall while it waits in a collective (it, or another):
  // the ops up to each collective reach the file, so salvage finds them.
  tracer_->Flush();
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = writer_->Flush(); !s.ok() && failed_.ok()) failed_ = s;
}

void Recorder::OnCollectiveFailed(const CollectiveCall& call, const std::string& why) {
  if (stopped_) return;
  const std::string module = tracer_->CollectiveFailed();
  llvm::json::Object failed{{"kind", call.kind},   {"group", call.group}, {"seq", call.seq},
                            {"step", step_},       {"module", module},    {"error", why},
                            {"group_rank", call.group_rank}};
  absl::Status s = Annotate("collective_failed", std::move(failed));
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = s;
  }
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
  step_ = step;
  micro_batch_.clear();
  if (!record) return absl::OkStatus();
  in_step_ = true;
  if (Streaming()) {
    MOERR_RETURN_IF_ERROR(writer_->BeginStep(step));
  } else {
    ring_.push_back(StepBuffer{step, {}, {}});
    while (static_cast<int64_t>(ring_.size()) > options_.ring_steps) ring_.pop_front();
  }
  {
    at::DisableRecordFunctionGuard no_record;
    const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
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

bool Recorder::IsAnomaly(const StepOutcome& outcome) const {
  if (!std::isfinite(outcome.loss) || !std::isfinite(outcome.grad_norm)) return true;
  if (grad_norms_.size() < 3) return false;
  std::vector<double> sorted = grad_norms_;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double median = sorted[sorted.size() / 2];
  return median > 0 && outcome.grad_norm > options_.spike_factor * median;
}

absl::Status Recorder::WriteBuffer(StepBuffer& buffer) {
  MOERR_RETURN_IF_ERROR(writer_->BeginStep(buffer.step));
  const int64_t saved = step_;
  step_ = buffer.step;
  for (auto& [name, role, t] : buffer.tensors) {
    MOERR_ASSIGN_OR_RETURN(formats::TensorView view, ViewOf(t));
    MOERR_RETURN_IF_ERROR(writer_->PutTensor(name, role, buffer.step, view));
  }
  for (formats::Record& r : buffer.records) MOERR_RETURN_IF_ERROR(writer_->AppendRecord(std::move(r)));
  step_ = saved;
  written_.push_back(buffer.step);
  return writer_->EndStep(buffer.step);
}

absl::Status Recorder::StepEnd(int64_t step, StepOutcome outcome) {
  MOERR_CHECK(step == step_) << "StepEnd(" << step << ") but the step is " << step_;
  tracer_->set_enabled(false);
  tracer_->Flush();
  MOERR_RETURN_IF_ERROR(failed_);
  if (!in_step_) return absl::OkStatus();
  in_step_ = false;
  if (Streaming()) {
    written_.push_back(step);
    return writer_->EndStep(step);
  }
  const bool anomaly = IsAnomaly(outcome);
  if (std::isfinite(outcome.grad_norm)) grad_norms_.push_back(outcome.grad_norm);
  if (!anomaly) return absl::OkStatus();
  if (anomaly_step_ < 0) anomaly_step_ = step;
  MOERR_RETURN_IF_ERROR(AnnotateStep("anomaly", llvm::json::Object{{"loss", formats::JsonNumberOrName(outcome.loss)},
                                                                    {"grad_norm", formats::JsonNumberOrName(outcome.grad_norm)}}));
  for (StepBuffer& buffer : ring_) MOERR_RETURN_IF_ERROR(WriteBuffer(buffer));
  ring_.clear();
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
  return writer_->Close();
}

}  // namespace moerr::recorder
