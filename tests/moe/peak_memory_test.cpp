#include "moe/peak_memory.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace moerr::moe {
namespace {

// The peak counts what the scope allocated, at its highest, and nothing
// allocated before it; LibTorch's raw allocation interface keeps working
// inside and outside a scope (ops use it for scratch buffers).
TEST(PeakMemoryTest, CountsTheScopesAllocationsAtTheirPeak) {
  at::Tensor before = at::empty({1 << 20});  // 4 MiB, not the scope's
  int64_t peak = 0;
  {
    PeakMemoryScope scope;
    before.reset();  // freeing it does not lower the scope's count
    {
      at::Tensor a = at::empty({1000});  // 4000 bytes
      at::Tensor b = at::empty({2000});  // 8000 bytes
    }
    at::Tensor c = at::empty({500});  // 2000 bytes, after a and b are gone
    void* raw = c10::GetCPUAllocator()->raw_allocate(64);
    c10::GetCPUAllocator()->raw_deallocate(raw);
    peak = scope.peak_bytes();
  }
  EXPECT_GE(peak, 12000);
  EXPECT_LT(peak, 12000 + 4096);  // not the 4 MiB from before
  void* raw = c10::GetCPUAllocator()->raw_allocate(64);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  PeakMemoryScope again;
  EXPECT_EQ(again.peak_bytes(), 0);
}

}  // namespace
}  // namespace moerr::moe
