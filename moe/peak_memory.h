// The peak of CPU tensor memory while a scope is open, as
// torch.cuda.max_memory_allocated reports it on a GPU: bytes LibTorch's CPU
// allocator handed out and not yet freed, counting only allocations made in
// the scope. A counting wrapper is installed over the CPU allocator the
// first time a scope opens and stays (it only forwards while no scope is
// open). One scope at a time.
#pragma once

#include <cstdint>

namespace moerr::moe {

class PeakMemoryScope {
 public:
  PeakMemoryScope();
  ~PeakMemoryScope();
  PeakMemoryScope(const PeakMemoryScope&) = delete;
  PeakMemoryScope& operator=(const PeakMemoryScope&) = delete;

  int64_t peak_bytes() const;  // so far
};

}  // namespace moerr::moe
