#include "diff/tensor_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace moerr::diff {
namespace {

using formats::DType;


// fp32 bits made monotonic as unsigned integers: consecutive floats differ by
// one; -0 and +0 coincide.
inline uint32_t MonotonicBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits & 0x80000000u ? 0x80000000u - (bits & 0x7fffffffu) : bits + 0x80000000u;
}

// Position of `v` on the number line of `dtype`, in units in the last place
// of that dtype. bf16 and fp16 values are fp32 values with 7 and 10 mantissa
// bits, so their ULPs are fp32 ULPs shifted by 16 and 13 (within fp16's
// normal range). Integers: the value itself.
int64_t UlpIndex(DType dtype, double v) {
  switch (dtype) {
    case DType::kF64: {
      int64_t bits;
      std::memcpy(&bits, &v, 8);
      return bits < 0 ? std::numeric_limits<int64_t>::min() - bits : bits;
    }
    case DType::kF32: return MonotonicBits(static_cast<float>(v));
    case DType::kBF16: return MonotonicBits(static_cast<float>(v)) >> 16;
    case DType::kF16: return MonotonicBits(static_cast<float>(v)) >> 13;
    default: return static_cast<int64_t>(v);
  }
}

int MantissaBits(DType d) {
  switch (d) {
    case DType::kF64: return 52;
    case DType::kF32: return 23;
    case DType::kF16: return 10;
    case DType::kBF16: return 7;
    default: return 0;
  }
}

}  // namespace

struct TensorComparison::Sums {
  double sum_abs = 0, sum_sq = 0, dot = 0, aa = 0, bb = 0, max_abs = 0, max_rel = 0;
  uint64_t within_0p1 = 0, within_0p5 = 0, max_ulp = 0, finite = 0, nan_mismatch = 0, inf_mismatch = 0;
};

namespace {

// One pair of elements, NaN and Inf aware.
inline void AddPair(double x, double y, DType ulp_dtype, TensorComparison::Sums& acc) {
  const bool xn = std::isnan(x), yn = std::isnan(y);
  if (xn || yn) {
    acc.nan_mismatch += xn != yn;
    return;
  }
  if (std::isinf(x) || std::isinf(y)) {
    acc.inf_mismatch += x != y;
    return;
  }
  const double d = std::fabs(x - y), ax = std::fabs(x);
  ++acc.finite;
  acc.sum_abs += d, acc.sum_sq += d * d, acc.dot += x * y, acc.aa += x * x, acc.bb += y * y;
  acc.max_abs = std::max(acc.max_abs, d);
  acc.max_rel = std::max(acc.max_rel, d == 0 ? 0 : (ax == 0 ? std::numeric_limits<double>::infinity() : d / ax));
  acc.within_0p1 += d <= 1e-3 * ax;
  acc.within_0p5 += d <= 5e-3 * ax;
  if (d != 0) {
    const int64_t u = UlpIndex(ulp_dtype, x) - UlpIndex(ulp_dtype, y);
    acc.max_ulp = std::max<uint64_t>(acc.max_ulp, static_cast<uint64_t>(u < 0 ? -u : u));
  }
}

// fp32 against fp32, the common case: 256-element chunks reduced in float
// (branch-free, so the compiler vectorises it) and folded into doubles. A
// non-finite element makes the chunk's sums non-finite; such a chunk, or one
// whose float sums overflow, goes through AddPair instead.
void AccumulateF32(const float* a, const float* b, int64_t n, TensorComparison::Sums& acc) {
  constexpr int64_t kChunk = 256;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    const float* x = a + start;
    const float* y = b + start;
    float sum_abs = 0, sum_sq = 0, dot = 0, aa = 0, bb = 0, max_abs = 0, max_rel = 0;
    int32_t w1 = 0, w5 = 0;
    uint32_t ulp = 0;
    for (int64_t i = 0; i < len; ++i) {
      const float xi = x[i], yi = y[i];
      const float d = std::fabs(xi - yi), ax = std::fabs(xi);
      sum_abs += d, sum_sq += d * d, dot += xi * yi, aa += xi * xi, bb += yi * yi;
      max_abs = std::max(max_abs, d);
      max_rel = std::max(max_rel, d == 0.0f ? 0.0f : d / ax);
      w1 += d <= 1e-3f * ax;
      w5 += d <= 5e-3f * ax;
      const uint32_t ux = MonotonicBits(xi), uy = MonotonicBits(yi);
      ulp = std::max(ulp, ux > uy ? ux - uy : uy - ux);
    }
    if (!std::isfinite(sum_abs) || !std::isfinite(sum_sq) || !std::isfinite(dot) || !std::isfinite(aa) ||
        !std::isfinite(bb)) {
      for (int64_t i = 0; i < len; ++i) AddPair(x[i], y[i], DType::kF32, acc);
      continue;
    }
    acc.finite += len;
    acc.sum_abs += sum_abs, acc.sum_sq += sum_sq, acc.dot += dot, acc.aa += aa, acc.bb += bb;
    acc.max_abs = std::max<double>(acc.max_abs, max_abs);
    acc.max_rel = std::max<double>(acc.max_rel, max_rel);
    acc.within_0p1 += w1, acc.within_0p5 += w5;
    acc.max_ulp = std::max<uint64_t>(acc.max_ulp, ulp);
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

// Contiguous bytes of `view`: its own, or a copy in `storage`.
const std::byte* Contiguous(const formats::TensorView& view, int64_t numel, std::vector<std::byte>& storage) {
  if (view.IsContiguous()) return view.data;
  storage.resize(numel * formats::ItemSize(view.dtype));
  formats::CopyToContiguous(view, storage.data());
  return storage.data();
}

}  // namespace

absl::StatusOr<TensorMetrics> CompareTensors(const formats::TensorView& a, const formats::TensorView& b) {
  if (a.shape != b.shape) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shapes differ: %s and %s", ShapeString(a.shape), ShapeString(b.shape)));
  }
  auto numel = formats::CheckedNumel(a.shape);
  if (!numel.ok()) return numel.status();
  const int64_t n = *numel;
  std::vector<std::byte> a_copy, b_copy;
  TensorComparison comparison(a.dtype, b.dtype);
  comparison.Add(Contiguous(a, n, a_copy), Contiguous(b, n, b_copy), n);
  return comparison.Finish();
}

TensorComparison::TensorComparison(DType a, DType b)
    : a_(a), b_(b), ulp_dtype_(MantissaBits(a) <= MantissaBits(b) ? a : b), sums_(std::make_unique<Sums>()) {}

TensorComparison::~TensorComparison() = default;

void TensorComparison::Add(const std::byte* pa, const std::byte* pb, int64_t n) {
  numel_ += static_cast<uint64_t>(n);
  if (a_ == DType::kF32 && b_ == DType::kF32) {
    AccumulateF32(reinterpret_cast<const float*>(pa), reinterpret_cast<const float*>(pb), n, *sums_);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    AddPair(formats::LoadElement(a_, pa, i), formats::LoadElement(b_, pb, i), ulp_dtype_, *sums_);
  }
}

TensorMetrics TensorComparison::Finish() const {
  const Sums& acc = *sums_;
  TensorMetrics m;
  m.numel = numel_;
  m.nan_mismatch = acc.nan_mismatch;
  m.inf_mismatch = acc.inf_mismatch;
  if (acc.finite == 0) return m;
  const double finite = static_cast<double>(acc.finite);
  m.max_abs = acc.max_abs;
  m.max_rel = acc.max_rel;
  m.mean_abs = acc.sum_abs / finite;
  m.rmse = std::sqrt(acc.sum_sq / finite);
  m.rel_l2 = acc.aa > 0 ? std::sqrt(acc.sum_sq / acc.aa)
                        : (acc.sum_sq > 0 ? std::numeric_limits<double>::infinity() : 0);
  m.cosine = acc.aa > 0 && acc.bb > 0 ? acc.dot / std::sqrt(acc.aa * acc.bb) : (acc.aa == acc.bb ? 1.0 : 0.0);
  m.within_0p1 = static_cast<double>(acc.within_0p1) / finite;
  m.within_0p5 = static_cast<double>(acc.within_0p5) / finite;
  m.max_ulp = acc.max_ulp;
  return m;
}

double FingerprintDelta::Score() const { return std::max({rel_l2, rel_abs_max, rel_mean}); }

FingerprintDelta CompareFingerprints(const formats::Fingerprint& a, const formats::Fingerprint& b) {
  using F = formats::Fingerprint;
  FingerprintDelta d;
  d.bitwise_equal = a.numel == b.numel && a.hash == b.hash && a.Known(F::kHash) && b.Known(F::kHash);
  if (!d.bitwise_equal && (!a.Known(F::kHash) || !b.Known(F::kHash)) && a.checksum_kind != F::Checksum::kNone &&
      a.checksum_kind == b.checksum_kind) {
    d.checksums_differ = a.numel != b.numel || a.checksum != b.checksum;
    d.bitwise_equal = !d.checksums_differ && a.checksum_kind == F::Checksum::kCrc32;
  }
  // A count one side knows only as a lower bound (an imported dump) tells
  // whether such values are present, not how many.
  auto distance = [&](uint64_t x, uint64_t y, F::Field field) -> uint64_t {
    if (!a.Known(field) || !b.Known(field)) return (x > 0) != (y > 0);
    return x > y ? x - y : y - x;
  };
  d.nan_mismatch = distance(a.nan, b.nan, F::kNan);
  d.inf_mismatch = distance(a.pos_inf, b.pos_inf, F::kPosInf) + distance(a.neg_inf, b.neg_inf, F::kNegInf);
  if (d.bitwise_equal) return d;
  // Each is at most ||a - b|| / ||a||: the triangle inequality for the norms,
  // and |sum(a - b)| <= sqrt(n) ||a - b|| for the means.
  auto relative = [&](double delta) {
    if (delta == 0) return 0.0;
    return a.l2 > 0 ? delta / a.l2 : std::numeric_limits<double>::infinity();
  };
  // A statistic either side lacks measures nothing: its delta stays 0, and
  // with A's L2 unknown none is relative to anything.
  auto known = [&](F::Field field) { return a.Known(field | F::kL2) && b.Known(field); };
  if (known(F::kL2)) d.rel_l2 = relative(std::fabs(a.l2 - b.l2));
  if (known(F::kAbsMax)) d.rel_abs_max = relative(std::fabs(a.abs_max - b.abs_max));
  if (known(F::kMean)) d.rel_mean = relative(std::fabs(a.mean - b.mean) * std::sqrt(static_cast<double>(a.numel)));
  return d;
}

}  // namespace moerr::diff
