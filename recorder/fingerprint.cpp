#include "recorder/fingerprint.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>

#include "xxhash.h"

namespace moerr::recorder {
namespace {

constexpr double kF16Max = 65504.0;
constexpr double kBf16Max = 3.3895313892515355e38;

template <typename T>
void Accumulate(const T* data, int64_t n, formats::Fingerprint& f) {
  double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0, amax = 0;
  uint64_t nan = 0, pinf = 0, ninf = 0, b16 = 0, bb16 = 0, finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(data[i]);
    if (std::isnan(v)) {
      ++nan;
      continue;
    }
    if (std::isinf(v)) {
      v > 0 ? ++pinf : ++ninf;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      continue;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    const double a = std::fabs(v);
    amax = std::max(amax, a);
    sum += v;
    sq += v * v;
    b16 += a > kF16Max;
    bb16 += a > kBf16Max;
    ++finite;
  }
  f.numel = n;
  if (lo <= hi) {
    f.min = lo;
    f.max = hi;
  }
  f.mean = finite ? sum / finite : 0;
  f.abs_max = amax;
  f.l2 = std::sqrt(sq);
  f.nan = nan, f.pos_inf = pinf, f.neg_inf = ninf, f.beyond_f16 = b16, f.beyond_bf16 = bb16;
}

}  // namespace

formats::Fingerprint ComputeFingerprint(const at::Tensor& input) {
  formats::Fingerprint f;
  if (!input.defined()) return f;
  at::DisableRecordFunctionGuard no_record;  // contiguous() below must not be traced
  const at::Tensor t = input.is_contiguous() ? input : input.contiguous();
  const int64_t n = t.numel();
  if (n == 0) return f;
  const void* data = t.data_ptr();
  f.hash = XXH3_64bits(data, n * t.element_size());
  switch (t.scalar_type()) {
    case at::kFloat: Accumulate(static_cast<const float*>(data), n, f); break;
    case at::kDouble: Accumulate(static_cast<const double*>(data), n, f); break;
    case at::kBFloat16: Accumulate(static_cast<const c10::BFloat16*>(data), n, f); break;
    case at::kHalf: Accumulate(static_cast<const c10::Half*>(data), n, f); break;
    case at::kLong: Accumulate(static_cast<const int64_t*>(data), n, f); break;
    case at::kInt: Accumulate(static_cast<const int32_t*>(data), n, f); break;
    case at::kShort: Accumulate(static_cast<const int16_t*>(data), n, f); break;
    case at::kChar: Accumulate(static_cast<const int8_t*>(data), n, f); break;
    case at::kByte: Accumulate(static_cast<const uint8_t*>(data), n, f); break;
    case at::kBool: Accumulate(static_cast<const bool*>(data), n, f); break;
    default: f.numel = n;  // other dtypes: hash and size only
  }
  return f;
}

}  // namespace moerr::recorder
