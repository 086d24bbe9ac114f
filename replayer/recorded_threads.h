// The intra-op thread count a replay runs under (docs/REPLAY.md, "Thread
// count"): the one the step was recorded with.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

namespace moerr::replayer {

// Runs the replay with the intra-op thread count the step was recorded with
// (the "recording" annotation's "threads"; 0 when a bundle does not say),
// and restores this process's count afterwards. ATen's CPU kernels cut
// their work into one chunk per thread and reductions add the chunks'
// partial results (a sum over more than a grain of elements,
// native_layer_norm_backward's weight gradient), so the same op on the same
// inputs rounds differently under another count: a recording made under
// torchrun (OMP_NUM_THREADS=1) and replayed in a shell with every core
// would differ by roundings that are not the program's. The count is
// process-wide; replays run one at a time.
class RecordedThreads {
 public:
  explicit RecordedThreads(int64_t recorded) : before_(at::get_num_threads()) {
    if (recorded > 0 && recorded != before_) {
      at::set_num_threads(static_cast<int>(recorded));
      changed_ = true;
    }
  }
  ~RecordedThreads() {
    if (changed_) at::set_num_threads(before_);
  }
  RecordedThreads(const RecordedThreads&) = delete;
  RecordedThreads& operator=(const RecordedThreads&) = delete;

 private:
  const int before_;
  bool changed_ = false;
};

}  // namespace moerr::replayer
