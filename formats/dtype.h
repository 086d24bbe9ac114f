// Element types a bundle stores. Values match the `DType` enum in bundle.capnp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include "absl/strings/string_view.h"

namespace moerr::formats {

enum class DType : uint8_t {
  kF64 = 0,
  kF32 = 1,
  kBF16 = 2,
  kF16 = 3,
  kI64 = 4,
  kI32 = 5,
  kI16 = 6,
  kI8 = 7,
  kU8 = 8,
  kBool = 9,
};
inline constexpr int kNumDTypes = 10;

// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 1, 1.
int ItemSize(DType dtype);
// f64, f32, bf16, f16: the types whose values can overflow to Inf and carry
// a rounding error. Integer and bool tensors are neither.
bool IsFloating(DType dtype);
// "f32", "bf16", ... as moerr prints them.
absl::string_view DTypeName(DType dtype);
// safetensors spelling: "F32", "BF16", "BOOL", ...
absl::string_view SafetensorsDTypeName(DType dtype);
std::optional<DType> DTypeFromSafetensorsName(absl::string_view name);
// Accepts a raw enum value read from a file; nullopt when out of range.
std::optional<DType> DTypeFromRaw(uint64_t raw);

// Element `i` of a contiguous buffer of `dtype` as a double (bf16 and fp16
// decoded in software, NaN and Inf kept).
double LoadElement(DType dtype, const std::byte* data, int64_t i);

}  // namespace moerr::formats
