#include "recorder/fingerprint.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>
#include <type_traits>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"
#if defined(__x86_64__)
// XXH3 through libxxhash's run-time dispatch (AVX2 or AVX-512 where the CPU
// has them): the same hashes as the baseline build, faster.
#include "xxh_x86dispatch.h"
#endif

#include "recorder/fingerprint_simd.h"
#include "support/check.h"

namespace moerr::recorder {
namespace {

constexpr double kF16Max = 65504.0;
constexpr double kBf16Max = 3.3895313892515355e38;

// Running statistics; Add is the careful per-element path (NaN and Inf
// aware, in double).
struct Stats {
  double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0, amax = 0;
  uint64_t nan = 0, pinf = 0, ninf = 0, b16 = 0, bb16 = 0;

  void Add(double v) {
    if (std::isnan(v)) {
      ++nan;
      return;
    }
    lo = std::min(lo, v), hi = std::max(hi, v);
    if (std::isinf(v)) {
      v > 0 ? ++pinf : ++ninf;
      return;
    }
    const double a = std::fabs(v);
    amax = std::max(amax, a);
    sum += v, sq += v * v;
    b16 += a > kF16Max;
    bb16 += a > kBf16Max;
  }

  void Finish(int64_t n, formats::Fingerprint& f) const {
    const uint64_t finite = n - nan - pinf - ninf;
    f.numel = n;
    if (lo <= hi) f.min = lo, f.max = hi;
    f.mean = finite ? sum / finite : 0;
    f.abs_max = amax;
    f.l2 = std::sqrt(sq);
    f.nan = nan, f.pos_inf = pinf, f.neg_inf = ninf, f.beyond_f16 = b16, f.beyond_bf16 = bb16;
  }
};

using simd::kLanes;

std::atomic<bool> g_use_avx2{simd::CpuHasAvx2()};

// Float-representable values in 256-element chunks: each chunk is reduced
// in float over 8 lanes, lane l taking the values j + l (min, max, abs-max
// and counts are exact, the chunk sums carry float rounding), and folded
// into double sums. A chunk whose float sums are not finite (NaN, Inf, or
// squares past float range) is redone element by element with Stats::Add.
// kAvx2: the lanes come from the AVX2 kernels (fingerprint_simd.h, the same
// bits); else from the loop below, which the compiler vectorises.
template <bool kAvx2, typename T>
void AccumulateFloat(const T* data, int64_t n, Stats& stats) {
  constexpr int64_t kChunk = 256;
  float buf[kChunk];
  for (int64_t base = 0; base < n; base += kChunk) {
    const int64_t m = std::min(kChunk, n - base);
    const float* v;
    if constexpr (std::is_same_v<T, float>) {
      v = data + base;
    } else {
      int64_t j = 0;
      if constexpr (kAvx2) {
        j = m - m % kLanes;
        simd::Widen(data + base, j, buf);
      }
      for (; j < m; ++j) buf[j] = static_cast<float>(data[base + j]);
      v = buf;
    }
    float cs[kLanes] = {}, csq[kLanes] = {}, clo[kLanes], chi[kLanes], cam[kLanes] = {};
    uint32_t cb[kLanes] = {};
    int64_t done = 0;  // values already in the lanes
    if constexpr (kAvx2) {
      done = m - m % kLanes;
      simd::Lanes r;
      simd::ReduceLanes(v, done, r);
      std::memcpy(cs, r.sum, sizeof cs), std::memcpy(csq, r.sq, sizeof csq), std::memcpy(clo, r.lo, sizeof clo);
      std::memcpy(chi, r.hi, sizeof chi), std::memcpy(cam, r.amax, sizeof cam), std::memcpy(cb, r.beyond_f16, sizeof cb);
    } else {
      for (int l = 0; l < kLanes; ++l) clo[l] = INFINITY, chi[l] = -INFINITY;
    }
    for (int64_t j = done; j < m; j += kLanes) {  // all of them, or the AVX2 kernel's partial last group
      const int lanes = static_cast<int>(std::min<int64_t>(kLanes, m - j));
      for (int l = 0; l < lanes; ++l) {
        const float x = v[j + l], a = std::fabs(x);
        cs[l] += x;
        csq[l] += x * x;
        clo[l] = x < clo[l] ? x : clo[l];
        chi[l] = x > chi[l] ? x : chi[l];
        cam[l] = a > cam[l] ? a : cam[l];
        cb[l] += a > 65504.0f;
      }
    }
    float s1 = 0, s2 = 0;
    for (int l = 0; l < kLanes; ++l) s1 += cs[l], s2 += csq[l];
    if (!std::isfinite(s1) || !std::isfinite(s2)) {
      for (int64_t k = 0; k < m; ++k) stats.Add(v[k]);
      continue;
    }
    stats.sum += s1, stats.sq += s2;
    for (int l = 0; l < kLanes; ++l) {
      stats.lo = std::min<double>(stats.lo, clo[l]), stats.hi = std::max<double>(stats.hi, chi[l]);
      stats.amax = std::max<double>(stats.amax, cam[l]);
      stats.b16 += cb[l];
    }
  }
}

template <typename T>
void Accumulate(const T* data, int64_t n, Stats& stats) {
  for (int64_t i = 0; i < n; ++i) stats.Add(static_cast<double>(data[i]));
}

template <typename T>
void AccumulateFloat(const T* data, int64_t n, Stats& stats) {
  if (g_use_avx2.load(std::memory_order_relaxed)) {
    AccumulateFloat<true>(data, n, stats);
  } else {
    AccumulateFloat<false>(data, n, stats);
  }
}

// Folds `n` elements of `dtype` at `data` into `stats`; false for a dtype
// without statistics (hash and size only). Calls whose sizes are multiples
// of 256 elements give the same statistics as one call over all of them.
bool AccumulateAny(at::ScalarType dtype, const void* data, int64_t n, Stats& stats) {
  switch (dtype) {
    case at::kFloat: AccumulateFloat(static_cast<const float*>(data), n, stats); return true;
    case at::kDouble: Accumulate(static_cast<const double*>(data), n, stats); return true;
    case at::kBFloat16: AccumulateFloat(static_cast<const c10::BFloat16*>(data), n, stats); return true;
    case at::kHalf: AccumulateFloat(static_cast<const c10::Half*>(data), n, stats); return true;
    case at::kLong: Accumulate(static_cast<const int64_t*>(data), n, stats); return true;
    case at::kInt: Accumulate(static_cast<const int32_t*>(data), n, stats); return true;
    case at::kShort: Accumulate(static_cast<const int16_t*>(data), n, stats); return true;
    case at::kChar: Accumulate(static_cast<const int8_t*>(data), n, stats); return true;
    case at::kByte: Accumulate(static_cast<const uint8_t*>(data), n, stats); return true;
    case at::kBool: Accumulate(static_cast<const bool*>(data), n, stats); return true;
    default: return false;
  }
}

// Copies the elements of a strided tensor in row-major order, a block at a
// time: what `contiguous()` would hold, without allocating it or
// dispatching an op.
class Gatherer {
 public:
  explicit Gatherer(const at::Tensor& t)
      : base_(static_cast<const char*>(t.data_ptr())),
        esize_(static_cast<int64_t>(t.element_size())),
        sizes_(t.sizes().vec()),
        strides_(t.strides().vec()),
        index_(sizes_.size(), 0) {}

  // The next `m` elements into `out` (m no more than what is left).
  void Next(int64_t m, char* out) {
    const size_t d = sizes_.size();
    while (m > 0) {
      int64_t offset = 0;
      for (size_t k = 0; k < d; ++k) offset += index_[k] * strides_[k];
      const int64_t run = std::min(m, sizes_[d - 1] - index_[d - 1]);
      const int64_t inner = strides_[d - 1];
      if (inner == 1) {
        std::memcpy(out, base_ + offset * esize_, run * esize_);
      } else {
        for (int64_t j = 0; j < run; ++j) std::memcpy(out + j * esize_, base_ + (offset + j * inner) * esize_, esize_);
      }
      out += run * esize_, m -= run;
      index_[d - 1] += run;
      for (size_t k = d - 1; k > 0 && index_[k] == sizes_[k]; --k) index_[k] = 0, ++index_[k - 1];
    }
  }

 private:
  const char* base_;
  int64_t esize_;
  std::vector<int64_t> sizes_, strides_, index_;
};

}  // namespace

bool SetFingerprintSimd(bool on) { return g_use_avx2.exchange(on && simd::CpuHasAvx2()); }

c10::optional<ViewSource> SourceOf(const at::Tensor& t, uint64_t id) {
  if (!t.defined() || !t.has_storage() || !t.is_non_overlapping_and_dense()) return c10::nullopt;
  return ViewSource{t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.numel(), t.scalar_type(),
                    t.is_contiguous(), static_cast<uint32_t>(t._version()), id};
}

const ViewSource* ViewedInput(const at::Tensor& output, const std::vector<ViewSource>& inputs) {
  if (!output.has_storage() || !output.is_non_overlapping_and_dense()) return nullptr;
  for (const ViewSource& in : inputs) {
    if (in.storage == output.storage().unsafeGetStorageImpl() && in.offset == output.storage_offset() &&
        in.numel == output.numel() && in.dtype == output.scalar_type() &&
        in.version == static_cast<uint32_t>(output._version())) {
      return &in;
    }
  }
  return nullptr;
}

KnownFingerprint DeriveViewFingerprint(const KnownFingerprint& base, const ViewSource& source,
                                       const at::Tensor& view) {
  KnownFingerprint derived = base;
  if (!(source.contiguous && view.is_contiguous() && base.real_hash)) {
    std::vector<int64_t> geometry = {static_cast<int64_t>(base.fingerprint.hash)};
    geometry.insert(geometry.end(), view.sizes().begin(), view.sizes().end());
    geometry.insert(geometry.end(), view.strides().begin(), view.strides().end());
    derived.fingerprint.hash = XXH3_64bits(geometry.data(), geometry.size() * sizeof(int64_t));
    derived.real_hash = false;
  }
  return derived;
}

bool BytesReadable(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.device().is_cpu() && !t.is_meta() &&
         (t.numel() == 0 || t.storage().data() != nullptr);
}

formats::Fingerprint ComputeFingerprint(const at::Tensor& t) {
  formats::Fingerprint f;
  if (!t.defined()) return f;
  const int64_t n = t.numel();
  if (n == 0) return f;
  if (!BytesReadable(t)) {
    f.numel = static_cast<uint64_t>(n);
    f.unknown = ~0u;
    return f;
  }
  const int64_t esize = static_cast<int64_t>(t.element_size());
  // Blocks of 16384 elements (a multiple of AccumulateFloat's chunk): the
  // hash and the statistics read each block while it is in cache.
  constexpr int64_t kBlock = 16384;
  Stats stats;
  bool has_stats = true;
  if (t.is_contiguous() && n <= kBlock) {
    f.hash = XXH3_64bits(t.data_ptr(), n * esize);
    has_stats = AccumulateAny(t.scalar_type(), t.data_ptr(), n, stats);
  } else {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    std::optional<Gatherer> gather;
    std::vector<char> buffer;
    if (!t.is_contiguous()) gather.emplace(t), buffer.resize(kBlock * esize);
    const char* data = static_cast<const char*>(t.data_ptr());
    for (int64_t base = 0; base < n; base += kBlock) {
      const int64_t m = std::min(kBlock, n - base);
      const char* block = data + base * esize;
      if (gather) gather->Next(m, buffer.data()), block = buffer.data();
      XXH3_64bits_update(&state, block, m * esize);
      has_stats = AccumulateAny(t.scalar_type(), block, m, stats);
    }
    f.hash = XXH3_64bits_digest(&state);
  }
  if (has_stats) {
    stats.Finish(n, f);
  } else {
    f.numel = n;  // other dtypes: hash and size only
  }
  return f;
}

std::vector<uint64_t> SliceHashes(const at::Tensor& t, const std::vector<int64_t>& rows) {
  if (rows.empty()) return {t.defined() ? ComputeFingerprint(t).hash : 0};
  if (!t.is_contiguous() || t.dim() == 0) return {};
  const int64_t row_bytes = t.size(0) == 0 ? 0 : t.numel() / t.size(0) * static_cast<int64_t>(t.element_size());
  const char* data = static_cast<const char*>(t.data_ptr());
  std::vector<uint64_t> hashes;
  hashes.reserve(rows.size());
  int64_t row = 0;
  for (int64_t n : rows) {
    MOERR_CHECK(n >= 0 && row + n <= t.size(0)) << "slices beyond the tensor's rows";
    // An empty slice hashes to 0, as ComputeFingerprint gives an empty tensor.
    hashes.push_back(n == 0 || row_bytes == 0 ? 0 : XXH3_64bits(data + row * row_bytes, static_cast<size_t>(n * row_bytes)));
    row += n;
  }
  return hashes;
}

}  // namespace moerr::recorder
