// The op tracer: a global at::RecordFunction observer that records the
// outermost ATen op on each thread, in forward, backward and optimizer, as an
// OpEvent (DESIGN.md, "The trace"). Inputs are read in the start callback,
// outputs in the end callback. Fingerprints, byte captures and the hand-off
// to the sink run on a TraceWorker thread; an op that writes a tensor first
// waits until the worker has read it.
//
// Tensor ids follow TensorImpl identity and version counter. The tracer holds
// a weak reference to each TensorImpl it has named, so a freed address that
// is reused for a new tensor gets a new id. A tensor read before any recorded
// op produced it is a leaf; in replayable and full modes its bytes are
// captured at first use. Module paths come from USER_SCOPE records (the model
// pushes "model.layers.3.mlp.experts.5"); a backward op takes the path of the
// forward op whose autograd node it runs. Values first seen in backward
// (saved inside composite ops, engine buffers) are captured as "saved/<id>",
// not leaves. Ops inside a scope named
// "optimizer" are in the optimizer phase; leaves first read inside a scope
// named "batch" are the batch. Ops inside a scope named "generate" are not
// recorded: a rollout's sampling loop is the inference engine's work, not
// the training step's, and what it returns is a leaf of the step (read it
// first inside "batch" to make it part of the batch).
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

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "formats/bundle_index.h"
#include "formats/trace.h"
#include "recorder/fingerprint.h"
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
};

class OpTracer {
 public:
  // At most one tracer exists at a time. `batch_ops`: ops per OpBatch handed
  // to the sink (smaller: less lost in a crash, more records).
  OpTracer(CaptureMode mode, TraceSink* sink, size_t batch_ops = 1024);
  ~OpTracer();
  OpTracer(const OpTracer&) = delete;
  OpTracer& operator=(const OpTracer&) = delete;

  void set_enabled(bool on);
  // Forgets the autograd attribution of earlier steps (call at a step start).
  void NewStep();
  // Names parameters' leaves "param/<name>" instead of "leaf/<id>".
  void NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named);
  // Hands the pending ops to the sink; returns once the sink has them.
  void Flush();
  uint64_t ops_recorded() const;

  // The RecordFunction callbacks (public for the C callback trampolines).
  std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn);
  void OnEnd(const at::RecordFunction& fn, at::ObserverContext* ctx);

 private:
  struct Known {
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    uint32_t version = 0;
    uint64_t id = 0;
  };
  // The same values seen through another TensorImpl: autograd unpacks saved
  // tensors as new variables over the same storage. Keyed by storage, view
  // geometry and dtype; the weak storage reference guards against reuse.
  struct AliasKey {
    const void* storage;
    int64_t offset;
    absl::InlinedVector<int64_t, 6> sizes, strides;  // inline: no allocation per lookup
    int dtype;
    bool operator==(const AliasKey& o) const {
      return storage == o.storage && offset == o.offset && sizes == o.sizes && strides == o.strides && dtype == o.dtype;
    }
    template <typename H>
    friend H AbslHashValue(H h, const AliasKey& k) {
      return H::combine(std::move(h), k.storage, k.offset, k.sizes, k.strides, k.dtype);
    }
  };
  struct KnownAlias {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;  // the tensor recorded under `id`
    uint32_t version = 0;
    uint64_t id = 0;
  };
  // Storage -> a tensor id over it, for views of composite ops' internals.
  struct KnownStorage {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    uint32_t version = 0;
    uint64_t id = 0;
  };
  static AliasKey AliasOf(const at::Tensor& t);
  // The id `t` already has (by TensorImpl or by alias), or 0.
  uint64_t KnownId(const at::Tensor& t);
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
  // whether it allocates without filling (`empty`...).
  struct SchemaInfo {
    std::vector<bool> written;
    bool returns_nothing = false;
    bool random = false;
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
  void FlushLocked();

  CaptureMode mode_;
  size_t batch_ops_;
  at::CallbackHandle handle_;
  mutable std::mutex mu_;
  bool enabled_ = true;
  uint64_t next_seq_ = 0;
  uint64_t next_id_ = 1;
  uint64_t recorded_ = 0;
  // The batch being filled; elements from pending_ops_ / pending_tensors_
  // on are a spare batch's slots, overwritten before use.
  formats::OpBatch pending_;
  size_t pending_ops_ = 0, pending_tensors_ = 0;
  absl::flat_hash_map<const c10::TensorImpl*, Known> known_;
  absl::flat_hash_map<AliasKey, KnownAlias> aliases_;
  absl::flat_hash_map<const void*, KnownStorage> storages_;
  uint64_t step_first_id_ = 1;  // ids below belong to earlier steps
  absl::flat_hash_set<uint64_t> unfilled_;  // outputs of `empty`-like ops no recorded op has read yet
  absl::flat_hash_map<const c10::TensorImpl*, std::string> names_;
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
  size_t inserts_since_prune_ = 0;
  // By the name pointer an op's schema owns (stable for the process).
  absl::flat_hash_map<const char*, SchemaInfo> schema_info_;
  TraceWorker worker_;  // last: destroyed first, after the final flush
};

}  // namespace moerr::recorder
