#include "importers/dump_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "formats/dtype.h"

namespace moerr::importers {
namespace {

using formats::DType;
using formats::Fingerprint;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kF16Max = 65504.0;
constexpr double kBf16Max = 3.3895313892515355e38;

void SetUnknown(Fingerprint& f, uint32_t fields) {
  f.unknown |= fields;
  if (fields & Fingerprint::kMin) f.min = kNaN;
  if (fields & Fingerprint::kMax) f.max = kNaN;
  if (fields & Fingerprint::kMean) f.mean = kNaN;
  if (fields & Fingerprint::kAbsMax) f.abs_max = kNaN;
  if (fields & Fingerprint::kL2) f.l2 = kNaN;
}

// Counts of finite values past the 16-bit ranges: none when the finite
// abs-max is within them, at least one (a lower bound) when it is past.
void SetBeyond(Fingerprint& f) {
  if (!f.Known(Fingerprint::kAbsMax)) {
    f.unknown |= Fingerprint::kBeyondF16 | Fingerprint::kBeyondBf16;
    return;
  }
  for (auto [limit, count, bit] : {std::make_tuple(kF16Max, &f.beyond_f16, Fingerprint::kBeyondF16),
                                   std::make_tuple(kBf16Max, &f.beyond_bf16, Fingerprint::kBeyondBf16)}) {
    *count = f.abs_max > limit ? 1 : 0;
    if (f.abs_max > limit) f.unknown |= bit;
  }
}

// A floating tensor. torch.max / torch.min propagate NaN, so a Max that is
// not NaN means no NaN anywhere; Max_except_inf_nan is the largest finite
// value, NaN when no value is finite.
void FloatingStats(const DumpValue& v, Fingerprint& f) {
  const double max = *v.max, min = *v.min;
  const bool any_nan = std::isnan(max) || std::isnan(min);
  const bool finite = std::isfinite(max) && std::isfinite(min);
  if (any_nan && v.max_finite && std::isnan(*v.max_finite) && v.min_finite && std::isnan(*v.min_finite) &&
      std::isnan(max)) {
    // Every value NaN (msprobe's handle_tensor_extremum_nan_inf): exact.
    f.nan = f.numel;
    f.mean = f.abs_max = f.l2 = 0;
    return;
  }
  if (any_nan) {
    f.nan = 1;
    SetUnknown(f, Fingerprint::kNan | Fingerprint::kMin | Fingerprint::kMax | Fingerprint::kPosInf |
                      Fingerprint::kNegInf);
  } else {
    f.min = min, f.max = max;
    f.pos_inf = max == INFINITY;
    f.neg_inf = min == -INFINITY;
    if (f.pos_inf) f.unknown |= Fingerprint::kPosInf;
    if (f.neg_inf) f.unknown |= Fingerprint::kNegInf;
  }
  if (finite) {
    f.abs_max = std::max(std::fabs(max), std::fabs(min));
    f.mean = v.mean && std::isfinite(*v.mean) ? *v.mean : kNaN;
    if (std::isnan(f.mean)) SetUnknown(f, Fingerprint::kMean);
    // Norm is reduced in the tensor's dtype: an fp16 tensor's may overflow.
    f.l2 = v.norm && std::isfinite(*v.norm) ? *v.norm : kNaN;
    if (std::isnan(f.l2)) SetUnknown(f, Fingerprint::kL2);
    return;
  }
  // Not finite. The *_except_inf_nan extremes are finite when any value is
  // and otherwise NaN or infinite (msprobe falls back to the non-NaN values).
  const std::optional<double> hi = std::isfinite(max) ? std::optional<double>(max) : v.max_finite;
  const std::optional<double> lo = std::isfinite(min) ? std::optional<double>(min) : v.min_finite;
  if (hi && lo && std::isfinite(*hi) && std::isfinite(*lo)) {
    // Mean and L2 over the finite values are not in the dump.
    f.abs_max = std::max(std::fabs(*hi), std::fabs(*lo));
    SetUnknown(f, Fingerprint::kMean | Fingerprint::kL2);
  } else if (hi && lo) {
    f.abs_max = f.mean = f.l2 = 0;  // no finite value: the recorder's statistics of none
  } else {
    SetUnknown(f, Fingerprint::kAbsMax | Fingerprint::kMean | Fingerprint::kL2);
  }
}

// msprobe's "md5" field as a checksum: 8 hex digits are the md5 summary's
// CRC-32, "0x" and 16 hex digits the xor summary's 64-bit xor. Any other
// text is left unread (no checksum), as is an empty one.
void SetChecksum(const std::string& text, Fingerprint& f) {
  absl::string_view digits = text;
  const bool xor64 = absl::ConsumePrefix(&digits, "0x");
  uint64_t value = 0;
  if (digits.size() != (xor64 ? 16u : 8u) || !absl::SimpleHexAtoi(digits, &value)) return;
  f.checksum = value;
  f.checksum_kind = xor64 ? Fingerprint::Checksum::kXor64 : Fingerprint::Checksum::kCrc32;
}

}  // namespace

std::optional<DType> DTypeFromDumpName(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  for (absl::string_view prefix : {"torch.", "mindspore.", "numpy.", "np."}) {
    if (absl::StartsWith(n, prefix)) n = n.substr(prefix.size());
  }
  static const std::pair<absl::string_view, DType> kNames[] = {
      {"float64", DType::kF64}, {"double", DType::kF64},  {"float32", DType::kF32}, {"float", DType::kF32},
      {"bfloat16", DType::kBF16}, {"float16", DType::kF16}, {"half", DType::kF16},  {"int64", DType::kI64},
      {"long", DType::kI64},     {"int32", DType::kI32},   {"int", DType::kI32},    {"int16", DType::kI16},
      {"short", DType::kI16},    {"int8", DType::kI8},     {"uint8", DType::kU8},   {"bool", DType::kBool},
      {"bool_", DType::kBool}};
  for (const auto& [spelling, dtype] : kNames) {
    if (n == spelling) return dtype;
  }
  return std::nullopt;
}

Fingerprint FingerprintFromStats(const DumpValue& v, DType dtype, uint64_t numel) {
  Fingerprint f;
  f.numel = numel;
  f.unknown = Fingerprint::kHash;
  SetChecksum(v.checksum, f);
  if (numel == 0) return f;  // min and max NaN, the rest 0: as recorded
  if (!v.max || !v.min) {
    // No statistics (a meta tensor, or a dump without them): only the size.
    f.nan = f.pos_inf = f.neg_inf = 0;
    SetUnknown(f, ~uint32_t{0});
    return f;
  }
  if (formats::IsFloating(dtype)) {
    FloatingStats(v, f);
  } else if (dtype == DType::kBool) {
    // Max is any(), Min is all(): no mean or norm.
    f.min = *v.min, f.max = *v.max, f.abs_max = *v.max;
    SetUnknown(f, Fingerprint::kMean | Fingerprint::kL2);
  } else {
    // Integers: reduced as float32, exact up to 2^24; never NaN or Inf.
    f.min = *v.min, f.max = *v.max;
    f.abs_max = std::max(std::fabs(*v.min), std::fabs(*v.max));
    f.mean = v.mean ? *v.mean : kNaN;
    f.l2 = v.norm && std::isfinite(*v.norm) ? *v.norm : kNaN;
    if (!v.mean) SetUnknown(f, Fingerprint::kMean);
    if (std::isnan(f.l2)) SetUnknown(f, Fingerprint::kL2);
  }
  SetBeyond(f);
  return f;
}

void ApplyNanCheck(const DumpEntry& entry, DType dtype, Fingerprint& f) {
  if (entry.is_nan.value_or(0) == 0 || !formats::IsFloating(dtype) || !f.Finite()) return;
  f.nan = 1;
  f.unknown |= Fingerprint::kNan;
}

}  // namespace moerr::importers
