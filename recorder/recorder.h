// Recorder: captures training steps of any LibTorch program into a bundle.
//
//   auto rec = Recorder::Start(RecordOptions("run.moerr").set_mode(CaptureMode::kStats));
//   for (step ...) {
//     rec->StepBegin(step);
//     ... forward, backward, optimizer (ops inside a "optimizer" user scope) ...
//     rec->StepEnd(step, {loss, grad_norm});
//   }
//   rec->Stop();
//
// Triggers: every step, a step window, or on anomaly (the last N steps kept
// in a ring of files, anomaly_ring.h, and written when a step is anomalous,
// anomaly_trigger.h, raised, or makes its first non-finite value from
// finite inputs). A step left by an exception ends with StepRaised instead of
// StepEnd: recorded as raised (formats/raised_step.h), not complete. A fatal signal
// (SIGSEGV, SIGABRT, SIGBUS, SIGFPE) appends a crash record, best effort; the
// bundle stays salvageable either way.
#pragma once

#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_writer.h"
#include "formats/raised_step.h"
#include "absl/container/flat_hash_set.h"
#include "recorder/anomaly_ring.h"
#include "recorder/anomaly_trigger.h"
#include "recorder/op_tracer.h"
#include "recorder/hooks/collective_hook.h"
#include "recorder/hooks/routing_hook.h"

namespace moerr::recorder {

enum class Trigger { kAlways, kWindow, kAnomaly };

struct RecordOptions {
  explicit RecordOptions(std::string path) : path(std::move(path)) {}

  std::string path;                                  // required: the bundle to write
  CaptureMode mode = CaptureMode::kReplayable;
  Trigger trigger = Trigger::kAlways;
  int64_t first_step = 0;                            // kWindow: steps [first, last]
  int64_t last_step = std::numeric_limits<int64_t>::max();
  int64_t ring_steps = 2;                            // kAnomaly: steps kept in the ring (>= 1)
  double spike_factor = 10.0;                        // kAnomaly: grad norm / running median
  std::vector<MetricWatch> watches;                  // kAnomaly: rules on named metrics
  bool overwrite = false;
  bool capture_logits = true;                        // routing: store router logits too
  bool crash_handler = true;                         // append a crash record on fatal signals
  size_t batch_ops = 1024;                           // ops per record frame

  RecordOptions& set_mode(CaptureMode v) { mode = v; return *this; }
  RecordOptions& set_window(int64_t first, int64_t last) { trigger = Trigger::kWindow; first_step = first; last_step = last; return *this; }
  RecordOptions& set_anomaly(int64_t ring, double spike) { trigger = Trigger::kAnomaly; ring_steps = ring; spike_factor = spike; return *this; }
  RecordOptions& set_overwrite(bool v) { overwrite = v; return *this; }
  RecordOptions& set_crash_handler(bool v) { crash_handler = v; return *this; }
  RecordOptions& set_batch_ops(size_t v) { batch_ops = v; return *this; }
};

class Recorder : public TraceSink, public RoutingObserver, public CollectiveObserver {
 public:
  static absl::StatusOr<std::unique_ptr<Recorder>> Start(RecordOptions options);
  ~Recorder() override;  // Stops if still running (errors are logged)

  absl::Status StepBegin(int64_t step);
  // Ends a complete step. Named metrics are written as the step annotation
  // "outcome" ({"loss": 0.41, "reward": 0.62, ...}; non-finite as names).
  absl::Status StepEnd(int64_t step, StepOutcome outcome = {});
  // Ends a step left by an exception: the ops recorded so far and the
  // annotation "raised" (with the last op seen) reach the file; the step is
  // not complete. The anomaly trigger keeps it as it keeps an anomalous one.
  absl::Status StepRaised(int64_t step, formats::RaisedStep raised);
  // A step-less annotation (model config, versions), written at once.
  absl::Status Annotate(const std::string& key, llvm::json::Value value);
  // An annotation of the current step (loss scale, metrics).
  absl::Status AnnotateStep(const std::string& key, llvm::json::Value value);
  // Parameter names, so their leaves are stored as "param/<name>@<id>".
  void NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named);
  absl::Status Stop();

  // Steps written so far; for kAnomaly, the step that triggered (-1: none).
  const std::vector<int64_t>& written_steps() const { return written_; }
  const std::string& path() const { return options_.path; }
  CaptureMode mode() const { return options_.mode; }
  int64_t anomaly_step() const { return anomaly_step_; }
  uint64_t ops_recorded() const { return tracer_ ? tracer_->ops_recorded() : ops_at_stop_; }
  const formats::WriteStats& write_stats() const { return writer_->stats(); }

  // TraceSink and RoutingObserver.
  void OnOps(formats::OpBatch& batch) override;
  void OnTensorBytes(std::string name, formats::Role role, at::Tensor snapshot) override;
  void OnError(absl::Status status) override;
  void OnRouting(const RoutingEvent& event) override;
  // CollectiveObserver: each collective becomes an op of the step
  // (OpTracer::CollectiveStart). Streaming, the ops up to each collective's
  // start and end go to the file at once, so a rank killed while it waits
  // salvages to there. A failed one is also written at once as the
  // step-less annotation "collective_failed" (kind, group, seq, module,
  // error, the last op recorded): the collective this rank waited in.
  void OnCollectiveStart(const CollectiveCall& call, const std::vector<at::Tensor>& inputs, bool in_place) override;
  void OnCollectiveEnd(const CollectiveCall& call, const std::vector<at::Tensor>& outputs) override;
  void OnCollectiveFailed(const CollectiveCall& call, const std::string& why) override;
  // TraceSink: a collective from the dispatcher (OpTracer::NameGroups).
  // Persist writes what the writer holds to the file; a failed one is the
  // annotation "collective_failed", as above.
  void Persist() override;
  void OnCollectiveFailed(const CollectiveCall& call, const std::string& module, const std::string& why) override;
  // The trace's names for process groups, by their own (OpTracer::NameGroups),
  // and the next number in one (OpTracer::NextCollectiveInGroup).
  void NameGroups(const std::vector<std::pair<std::string, std::string>>& names);
  int64_t NextCollectiveInGroup(const std::string& group);

 private:
  explicit Recorder(RecordOptions options);
  bool Streaming() const { return options_.trigger != Trigger::kAnomaly; }
  // Where the step's records go: the bundle, or (kAnomaly) the step's slot
  // of the ring; nullptr outside a step of the ring.
  formats::BundleWriter* StepWriter() { return Streaming() ? writer_.get() : ring_->current(); }
  absl::Status Emit(formats::Record record);
  absl::Status EmitTensor(const std::string& name, formats::Role role, const at::Tensor& t);
  // kAnomaly, on the worker thread with mu_ held: the first op of the step
  // whose inputs are finite and whose output is not (analysis::
  // FindFirstOverflow's rule) marks the ring for keeping; from then on each
  // op reaches the file as it ends.
  void WatchFirstOverflow(const formats::OpBatch& batch);
  // kAnomaly: the step's slot is annotated with `why` and ended, and the
  // ring copied into the bundle.
  absl::Status KeepRing(llvm::json::Object why, bool complete);
  // Streaming: the ops traced so far, and everything the writer holds, to the file.
  void FlushToFile();
  void AnnotateFailedCollective(const CollectiveCall& call, const std::string& module, const std::string& why);

  RecordOptions options_;
  std::unique_ptr<formats::BundleWriter> writer_;
  std::unique_ptr<OpTracer> tracer_;
  std::mutex mu_;  // the writer and the ring: the tracer's worker thread writes op batches
  absl::Status failed_;  // first error inside a callback, reported at StepEnd / Stop
  bool stopped_ = false;
  int64_t step_ = -1;
  bool in_step_ = false;
  std::unique_ptr<AnomalyRing> ring_;  // kAnomaly
  AnomalyTrigger trigger_;
  // kAnomaly, within the step (mu_): the ids of its non-finite tensors, and
  // the first overflow when one was seen.
  absl::flat_hash_set<uint64_t> nonfinite_ids_;
  std::optional<uint64_t> first_overflow_;
  std::optional<formats::RaisedStep::LastOp> last_op_;  // of the step, from the ops handed over
  int64_t step_ops_ = 0;                                 // ops of the step handed over
  std::vector<int64_t> written_;
  int64_t anomaly_step_ = -1;
  std::vector<int64_t> micro_batch_;  // per layer, within the step
  uint64_t ops_at_stop_ = 0;
};

}  // namespace moerr::recorder
