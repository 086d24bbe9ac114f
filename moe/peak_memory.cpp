#include "moe/peak_memory.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>

#include "support/check.h"

namespace moerr::moe {
namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<uint64_t> g_scope{0};  // the open scope's number; 0: none
std::atomic<bool> g_open{false};

// What a counted allocation carries to its deleter.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
  uint64_t scope;
};

void DeleteCounted(void* ctx) {
  auto* c = static_cast<Counted*>(ctx);
  if (c->scope == g_scope.load()) g_live -= c->bytes;
  delete c;
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base_->allocate(n);
    if (!g_open.load()) return inner;
    const int64_t live = g_live += static_cast<int64_t>(n);
    for (int64_t peak = g_peak.load(); live > peak && !g_peak.compare_exchange_weak(peak, live);) {
    }
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* ctx = new Counted{std::move(inner), static_cast<int64_t>(n), g_scope.load()};
    return c10::DataPtr(data, ctx, &DeleteCounted, device);
  }

 private:
  c10::Allocator* base_;
};

void InstallOnce() {
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator(c10::GetCPUAllocator());
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
