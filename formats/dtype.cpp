#include "formats/dtype.h"

#include "support/check.h"

namespace moerr::formats {
namespace {

struct DTypeInfo {
  int item_size;
  absl::string_view name;
  absl::string_view safetensors_name;
};

// Indexed by the enum value.
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {8, "f64", "F64"}, {4, "f32", "F32"}, {2, "bf16", "BF16"}, {2, "f16", "F16"}, {8, "i64", "I64"},
    {4, "i32", "I32"}, {2, "i16", "I16"}, {1, "i8", "I8"},     {1, "u8", "U8"},   {1, "bool", "BOOL"},
};

const DTypeInfo& Info(DType dtype) {
  const auto i = static_cast<int>(dtype);
  MOERR_CHECK(i >= 0 && i < kNumDTypes) << "dtype " << i;
  return kInfo[i];
}

}  // namespace

int ItemSize(DType dtype) { return Info(dtype).item_size; }
absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }
absl::string_view SafetensorsDTypeName(DType dtype) { return Info(dtype).safetensors_name; }

std::optional<DType> DTypeFromSafetensorsName(absl::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kInfo[i].safetensors_name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromRaw(uint64_t raw) {
  if (raw >= kNumDTypes) return std::nullopt;
  return static_cast<DType>(raw);
}

}  // namespace moerr::formats
