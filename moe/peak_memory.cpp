#include "moe/peak_memory.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "support/check.h"

namespace moerr::moe {
namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<uint64_t> g_scope{0};  // the open scope's number; 0: none
std::atomic<bool> g_open{false};
c10::Allocator* g_base = nullptr;

// Counted allocations by address. The data pointer stays the context, as
// LibTorch's raw_allocate / raw_deallocate require of a CPU allocator.
struct Counted {
  int64_t bytes;
  uint64_t scope;
  c10::DeleterFnPtr base_deleter;
};
std::mutex g_mu;
absl::flat_hash_map<void*, Counted>& CountedAllocations() {
  static auto* map = new absl::flat_hash_map<void*, Counted>();
  return *map;
}

void DeleteCounted(void* ptr) {
  c10::DeleterFnPtr deleter = g_base->raw_deleter();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = CountedAllocations().find(ptr);
    if (it != CountedAllocations().end()) {
      if (it->second.scope == g_scope.load()) g_live -= it->second.bytes;
      deleter = it->second.base_deleter;
      CountedAllocations().erase(it);
    }
  }
  deleter(ptr);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = g_base->allocate(n);
    if (!g_open.load() || inner.get() == nullptr) return inner;
    MOERR_CHECK(inner.get() == inner.get_context()) << "the CPU allocator's context is its data pointer";
    const int64_t live = g_live += static_cast<int64_t>(n);
    for (int64_t peak = g_peak.load(); live > peak && !g_peak.compare_exchange_weak(peak, live);) {
    }
    void* data = inner.get();
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      CountedAllocations()[data] = Counted{static_cast<int64_t>(n), g_scope.load(), inner.get_deleter()};
    }
    inner.release_context();  // owned by the entry now
    return c10::DataPtr(data, data, &DeleteCounted, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteCounted; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_base->copy_data(dest, src, count);
  }
};

void InstallOnce() {
  static CountingAllocator* allocator = [] {
    g_base = c10::GetCPUAllocator();
    MOERR_CHECK(g_base->raw_deleter() != nullptr) << "a CPU allocator with a raw deleter";
    auto* a = new CountingAllocator();
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  (void)allocator;
}

}  // namespace

PeakMemoryScope::PeakMemoryScope() {
  InstallOnce();
  MOERR_CHECK(!g_open.load()) << "one PeakMemoryScope at a time";
  ++g_scope;
  g_live = 0;
  g_peak = 0;
  g_open = true;
}

PeakMemoryScope::~PeakMemoryScope() {
  g_open = false;
  ++g_scope;  // later frees of this scope's allocations count nowhere
}

int64_t PeakMemoryScope::peak_bytes() const { return g_peak.load(); }

}  // namespace moerr::moe
