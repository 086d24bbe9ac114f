#include "recorder/trace_worker.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <utility>

#include "recorder/op_tracer.h"
#include "absl/strings/str_cat.h"
#include "support/check.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::recorder {
namespace {

// Jobs or bytes staged before they are published to the worker.
constexpr size_t kPublishJobs = 256;
constexpr size_t kPublishBytes = size_t{16} << 20;
// Spent op batches kept for the producer to refill.
constexpr size_t kSpareBatches = 4;
// Spent items kept for reuse (a `small` step adds one per new tensor).
constexpr size_t kFreeItems = 4096;

// Whether a reference to `t` keeps its memory alive. A DataPtr without a
// context never frees its memory (at::from_blob without a deleter): the
// program owns it and may free it at any time.
bool OwnsMemory(const at::Tensor& t) {
  return !t.has_storage() || t.storage().data_ptr().get() == nullptr ||
         t.storage().data_ptr().get_context() != nullptr;
}

}  // namespace

// A new TensorImpl over a job's storage and geometry. The job keeps the
// memory alive without a reference to the program's tensor, whose
// use_count() LibTorch reads to decide whether it may take over a buffer
// (AccumulateGrad, InputBuffer): holding it would make the traced program
// run other ops. Built by the thread that runs the job, not the traced one.
at::Tensor TraceWorker::TensorOf(const Item& item) {
  if (!item.view) return item.job->tensor;
  const View& v = *item.view;
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(v.storage),
      c10::DispatchKeySet(c10::computeDispatchKey(c10::typeMetaToScalarType(v.dtype), at::kStrided,
                                                  v.storage.device())),
      v.dtype);
  impl->set_sizes_and_strides(v.sizes, v.strides);
  impl->set_storage_offset(v.offset);
  return at::Tensor(std::move(impl));
}

TraceWorker::TraceWorker(TraceSink* sink, size_t max_bytes)
    : sink_(sink), max_bytes_(max_bytes), thread_([this] { Run(); }) {}

TraceWorker::~TraceWorker() {
  Publish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  thread_.join();
}

const void* TraceWorker::StorageKey(const at::Tensor& t) {
  return t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl())
                         : static_cast<const void*>(t.unsafeGetTensorImpl());
}

std::unique_ptr<TraceWorker::Item> TraceWorker::NewItem() {
  if (free_items_.empty()) return std::make_unique<Item>();
  std::unique_ptr<Item> item = std::move(free_items_.back());
  free_items_.pop_back();
  return item;
}

void TraceWorker::Add(Job job) {
  std::unique_ptr<Item> item = NewItem();
  // A derived fingerprint reads no values: nothing for a write to wait on.
  if (job.base == 0 || !job.capture.empty()) {
    item->storage = StorageKey(job.tensor);
    item->bytes = job.tensor.nbytes();
  }
  const bool owned = OwnsMemory(job.tensor);
  if (job.tensor.has_storage() && job.tensor.layout() == at::kStrided) {
    View& v = item->view.emplace();
    v.storage = job.tensor.storage();
    v.sizes.assign(job.tensor.sizes().begin(), job.tensor.sizes().end());
    v.strides.assign(job.tensor.strides().begin(), job.tensor.strides().end());
    v.offset = job.tensor.storage_offset();
    v.dtype = job.tensor.dtype();
    job.tensor.reset();
  }
  item->job = std::move(job);
  if (item->storage != nullptr && !owned) {
    // Memory the program lent (from_blob) may be freed right after the op:
    // read it now.
    RunJob(*item);
    item->state.store(kDone);
    item->storage = nullptr;
    item->bytes = 0;
  }
  staged_bytes_ += item->bytes;
  staged_.push_back(std::move(item));
  if (staged_.size() >= kPublishJobs || staged_bytes_ >= kPublishBytes) Publish();
}

void TraceWorker::AddBatch(formats::OpBatch batch) {
  auto item = std::make_unique<Item>();
  item->batch = std::move(batch);
  staged_.push_back(std::move(item));
  Publish();
}

void TraceWorker::Publish() {
  if (staged_.empty()) return;
  bool wake = false;
  std::vector<std::unique_ptr<Item>> spent;
  {
    std::unique_lock<std::mutex> lock(mu_);
    spent.swap(spent_);
    // Back-pressure; a group larger than the bound alone still goes through.
    if (queued_bytes_ > 0 && queued_bytes_ + staged_bytes_ > max_bytes_) {
      ++waiters_;
      done_cv_.wait(lock, [&] { return queued_bytes_ == 0 || queued_bytes_ + staged_bytes_ <= max_bytes_; });
      --waiters_;
    }
    for (std::unique_ptr<Item>& item : staged_) {
      if (item->storage != nullptr) ++readers_[item->storage];
      queue_.push_back(std::move(item));
    }
    queued_bytes_ += staged_bytes_;
    unfinished_ += staged_.size();
    wake = worker_idle_;
  }
  staged_.clear();
  staged_bytes_ = 0;
  if (wake) work_cv_.notify_one();
  Recycle(spent);
}

void TraceWorker::Recycle(std::vector<std::unique_ptr<Item>>& spent) {
  for (std::unique_ptr<Item>& item : spent) {
    if (!item->job && spare_batches_.size() < kSpareBatches) spare_batches_.push_back(std::move(item->batch));
    if (free_items_.size() < kFreeItems) {
      item->job.reset();
      item->view.reset();
      item->batch = formats::OpBatch();
      item->storage = nullptr;
      item->bytes = 0;
      item->state.store(kQueued);
      item->result = KnownFingerprint();
      free_items_.push_back(std::move(item));
    }
  }
  spent.clear();
}

formats::OpBatch TraceWorker::SpareBatch() {
  if (spare_batches_.empty()) return formats::OpBatch();
  formats::OpBatch batch = std::move(spare_batches_.back());
  spare_batches_.pop_back();
  return batch;
}

void TraceWorker::RunJob(Item& item) {
  Job& job = *item.job;
  if (job.base != 0 && job.capture.empty()) return;  // derived in Run, from the view's geometry
  const at::Tensor tensor = TensorOf(item);
  if (job.base == 0) item.result.fingerprint = ComputeFingerprint(tensor);
  if (job.capture.empty()) return;
  if (!BytesReadable(tensor)) {
    sink_->OnError(absl::FailedPreconditionError(
        absl::StrCat("capturing ", job.capture, ": its bytes are not readable here (no storage, or a pending "
                     "functional collective's result); its fingerprint is marked unknown")));
    return;
  }
  at::DisableRecordFunctionGuard no_record;  // the copy is not an op of the traced program
  // Nor is it the program's Python dispatch modes' (a TorchDispatchMode
  // around the step): through one, the copy would come back owning a
  // Python object, whose release on the worker thread needs the GIL the
  // traced thread holds while it waits for this capture.
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::PreDispatch}));
  const absl::Status copied = CatchTorch(absl::StrCat("capturing ", job.capture), [&] {
    sink_->OnTensorBytes(job.capture, job.role, tensor.detach().clone());
    return absl::OkStatus();
  });
  if (!copied.ok()) sink_->OnError(copied);
}

void TraceWorker::Finish(Item& item) {
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    item.state.store(kDone);
    if (item.storage != nullptr) {
      auto it = readers_.find(item.storage);
      if (--it->second == 0) readers_.erase(it);
    }
    notify = waiters_ > 0;
  }
  if (notify) done_cv_.notify_all();
}

void TraceWorker::BeforeWrite(const at::Tensor& t) {
  const void* key = StorageKey(t);
  for (const std::unique_ptr<Item>& item : staged_) {
    if (item->storage == key) {
      Publish();
      break;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (readers_.contains(key)) {
    // Run a job the worker has not reached; it stays queued (and valid)
    // until the worker, in order, sees it done.
    // From the back: what is about to be written was most likely read
    // last, and the worker works from the front.
    Item* mine = nullptr;
    for (auto it = queue_.rbegin(); it != queue_.rend(); ++it) {
      int queued = kQueued;
      if ((*it)->storage == key && (*it)->state.compare_exchange_strong(queued, kRunning)) {
        mine = it->get();
        break;
      }
    }
    if (mine == nullptr) {  // the rest are the worker's, running
      ++waiters_;
      done_cv_.wait(lock, [&] { return !readers_.contains(key); });
      --waiters_;
      return;
    }
    lock.unlock();
    RunJob(*mine);
    Finish(*mine);
    lock.lock();
  }
}

void TraceWorker::Drain() {
  Publish();
  std::unique_lock<std::mutex> lock(mu_);
  ++waiters_;
  done_cv_.wait(lock, [&] { return unfinished_ == 0; });
  --waiters_;
  std::vector<std::unique_ptr<Item>> spent;
  spent.swap(spent_);
  lock.unlock();
  Recycle(spent);
}

void TraceWorker::NewStep() {
  Drain();
  fingerprints_.clear();  // the worker is idle: nothing is queued
}

void TraceWorker::Run() {
  at::DisableRecordFunctionGuard no_record;  // nothing this thread runs is the traced program's
  for (;;) {
    Item* item = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      worker_idle_ = true;
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      worker_idle_ = false;
      if (queue_.empty()) return;  // stopping, and everything ran
      item = queue_.front().get();  // stays queued (visible to BeforeWrite) until done
    }
    if (!item->job) {
      for (formats::TensorMeta& meta : item->batch.tensors) {
        auto it = fingerprints_.find(meta.id);
        MOERR_CHECK(it != fingerprints_.end()) << "tensor " << meta.id << " was never fingerprinted";
        meta.fingerprint = it->second.fingerprint;
      }
      sink_->OnOps(item->batch);
    } else {
      int queued = kQueued;
      if (item->state.compare_exchange_strong(queued, kRunning)) {
        RunJob(*item);
        Finish(*item);
      } else {
        std::unique_lock<std::mutex> lock(mu_);  // the tracer took it: wait for its result
        ++waiters_;
        done_cv_.wait(lock, [&] { return item->state.load() == kDone; });
        --waiters_;
      }
      const Job& job = *item->job;
      if (job.base != 0) {
        auto base = fingerprints_.find(job.base);
        MOERR_CHECK(base != fingerprints_.end()) << "view of tensor " << job.base << " before its fingerprint";
        fingerprints_.insert_or_assign(job.id, DeriveViewFingerprint(base->second, job.source, TensorOf(*item)));
      } else {
        fingerprints_.insert_or_assign(job.id, item->result);
      }
    }
    // The item keeps its storage reference: the producer drops it (Recycle).
    bool notify = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_bytes_ -= queue_.front()->bytes;
      spent_.push_back(std::move(queue_.front()));
      queue_.pop_front();
      --unfinished_;
      notify = waiters_ > 0;
    }
    if (notify) done_cv_.notify_all();
  }
}

}  // namespace moerr::recorder
