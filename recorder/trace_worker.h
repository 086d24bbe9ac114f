// The op tracer's second thread. The training thread only names tensors and
// builds op events; this thread computes the fingerprints, copies the bytes
// to capture and hands finished op batches to the sink (which encodes and
// writes them), so that work overlaps the step instead of lengthening it.
//
// Invariants:
//  - A job holds a strong reference to its tensor's storage, and the view's
//    geometry (not the program's TensorImpl, so the traced program sees no
//    extra reference to its tensors): the memory it reads is neither freed
//    nor reused before the job has run. Whichever thread runs the job builds
//    a tensor over them (TensorOf).
//  - The tracer calls BeforeWrite(t) before an op writes `t`: the jobs still
//    queued that read t's storage (through any view) run there and then, on
//    the tracer's thread, so every job reads the values of the op it
//    describes. Only a job the worker has already started is waited for.
//  - Items reach the sink in the order they were added, so a batch comes
//    after the fingerprints of every tensor it describes.
//  - At most `max_bytes` of queued tensors are held (and, until the
//    producer next takes them back, those of finished jobs); Add blocks
//    beyond that.
//  - A finished item goes back to the producer, which drops its storage
//    reference and reuses the item (or frees it) at its next Publish or
//    Drain: what the traced thread allocated, it frees. Freed on the
//    worker, the program's memory took the traced thread's malloc arena
//    lock from under its own allocations.
//
// One producer at a time: the tracer calls Add, AddBatch, BeforeWrite,
// Drain and NewStep under its own lock. Jobs are staged on the producer's
// side and published in groups, so the worker is woken once per group, not
// once per tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "formats/bundle_index.h"
#include "formats/trace.h"
#include "recorder/fingerprint.h"

namespace moerr::recorder {

class TraceSink;

class TraceWorker {
 public:
  struct Job {
    uint64_t id = 0;
    at::Tensor tensor;
    // Nonzero: `tensor` is a dense view of exactly the elements of tensor
    // `base` (an earlier job's), laid out as `source`; its fingerprint is
    // derived from the base's (fingerprint.h) instead of a pass.
    uint64_t base = 0;
    ViewSource source{};
    // Non-empty: also hand a copy of the bytes to the sink under this name.
    std::string capture;
    formats::Role role = formats::Role::kActivation;
  };

  TraceWorker(TraceSink* sink, size_t max_bytes);
  ~TraceWorker();  // runs what is queued, then joins
  TraceWorker(const TraceWorker&) = delete;
  TraceWorker& operator=(const TraceWorker&) = delete;

  void Add(Job job);
  // Hands `batch` to the sink once its tensors' fingerprints are known; each
  // TensorMeta's fingerprint is filled in then.
  void AddBatch(formats::OpBatch batch);
  // Runs (or waits for) every unfinished job that reads the storage of `t`.
  void BeforeWrite(const at::Tensor& t);
  // Blocks until everything added has reached the sink.
  void Drain();
  // A batch the sink is done with, its vectors and strings keeping their
  // capacity, for the producer to overwrite in place (or an empty batch).
  formats::OpBatch SpareBatch();
  // Drains, then forgets the fingerprints kept as bases of derived views.
  void NewStep();

 private:
  enum State { kQueued, kRunning, kDone };
  // What a job reads, kept instead of the program's tensor (see TensorOf).
  // Every field is set where one is made (no member initialisers: clang
  // then takes the nested struct for not default-constructible inside
  // std::optional).
  struct View {
    c10::Storage storage;
    c10::SmallVector<int64_t, 5> sizes, strides;
    int64_t offset;
    caffe2::TypeMeta dtype;
  };
  struct Item {
    std::optional<Job> job;  // job->tensor is undefined when `view` holds it
    std::optional<View> view;
    formats::OpBatch batch;
    const void* storage = nullptr;  // the job reads this storage's values
    size_t bytes = 0;
    std::atomic<int> state{kQueued};  // whoever moves it from kQueued runs it
    KnownFingerprint result;          // valid once kDone
  };
  // The tensor a job reads: over its View, or the job's own.
  static at::Tensor TensorOf(const Item& item);
  static const void* StorageKey(const at::Tensor& t);
  void Publish();
  // Takes finished items back on the producer's thread (what it allocated,
  // it frees: no allocator traffic between the threads): keeps their
  // batches as spares and some items for reuse.
  void Recycle(std::vector<std::unique_ptr<Item>>& spent);
  std::unique_ptr<Item> NewItem();  // a reset item from Recycle, or a new one
  // Computes the fingerprint and hands over the capture (either thread).
  void RunJob(Item& item);
  // After RunJob: marks `item` done and releases its readers.
  void Finish(Item& item);
  void Run();

  TraceSink* sink_;
  const size_t max_bytes_;
  // Producer side, not yet published.
  std::vector<std::unique_ptr<Item>> staged_;
  size_t staged_bytes_ = 0;

  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits for items
  std::condition_variable done_cv_;  // the tracer waits for items to finish
  std::deque<std::unique_ptr<Item>> queue_;  // the front is the worker's
  size_t unfinished_ = 0;     // items added and not yet finished
  size_t queued_bytes_ = 0;   // tensor bytes held by unfinished jobs
  absl::flat_hash_map<const void*, int> readers_;  // storage -> published jobs not done
  std::vector<std::unique_ptr<Item>> spent_;  // finished, for Recycle
  std::vector<formats::OpBatch> spare_batches_;  // producer side
  std::vector<std::unique_ptr<Item>> free_items_;  // producer side, reset
  bool stop_ = false;
  bool worker_idle_ = false;  // waiting on work_cv_
  int waiters_ = 0;           // threads waiting on done_cv_
  // Worker thread only: this step's fingerprints by tensor id.
  absl::flat_hash_map<uint64_t, KnownFingerprint> fingerprints_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace moerr::recorder
