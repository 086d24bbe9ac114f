#include "formats/dtype.h"

#include <cmath>
#include <cstring>

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

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0 && mant != 0) {  // subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = exp == 0x1f ? (sign | 0x7f800000 | (mant << 13))
                        : exp != 0  ? (sign | ((exp + 112) << 23) | (mant << 13))
                                    : sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T Read(const std::byte* data, int64_t i) {
  T v;
  std::memcpy(&v, data + sizeof(T) * i, sizeof(T));
  return v;
}

}  // namespace

bool IsFloating(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

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

double LoadElement(DType dtype, const std::byte* data, int64_t i) {
  switch (dtype) {
    case DType::kF64: return Read<double>(data, i);
    case DType::kF32: return Read<float>(data, i);
    case DType::kBF16: return Bf16ToFloat(Read<uint16_t>(data, i));
    case DType::kF16: return HalfToFloat(Read<uint16_t>(data, i));
    case DType::kI64: return static_cast<double>(Read<int64_t>(data, i));
    case DType::kI32: return Read<int32_t>(data, i);
    case DType::kI16: return Read<int16_t>(data, i);
    case DType::kI8: return Read<int8_t>(data, i);
    case DType::kU8: return Read<uint8_t>(data, i);
    case DType::kBool: return Read<uint8_t>(data, i) != 0 ? 1.0 : 0.0;
  }
  return 0;
}

}  // namespace moerr::formats
