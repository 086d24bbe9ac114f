#include "recorder/hooks/tensor_adapter.h"

#include <ATen/ATen.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace moerr::recorder {

absl::StatusOr<formats::DType> ToDType(at::ScalarType type) {
  using formats::DType;
  switch (type) {
    case at::kDouble: return DType::kF64;
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    case at::kShort: return DType::kI16;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kBool: return DType::kBool;
    default: return absl::InvalidArgumentError(absl::StrFormat("dtype %s cannot be stored", c10::toString(type)));
  }
}

at::ScalarType ToScalarType(formats::DType dtype) {
  static constexpr at::ScalarType kTypes[] = {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf, at::kLong,
                                              at::kInt,    at::kShort, at::kChar,     at::kByte, at::kBool};
  return kTypes[static_cast<int>(dtype)];
}

absl::StatusOr<formats::TensorView> ViewOf(const at::Tensor& t) {
  if (!t.device().is_cpu()) return absl::InvalidArgumentError("only CPU tensors can be viewed; copy to CPU first");
  auto dtype = ToDType(t.scalar_type());
  if (!dtype.ok()) return dtype.status();
  formats::TensorView v;
  v.dtype = *dtype;
  v.shape = t.sizes().vec();
  v.strides = t.strides().vec();
  v.data = static_cast<const std::byte*>(t.data_ptr());
  v.owner = std::make_shared<at::Tensor>(t);
  return v;
}

at::Tensor ToTensor(const formats::TensorView& view) {
  const auto options = at::TensorOptions().dtype(ToScalarType(view.dtype));
  at::Tensor out = at::empty(view.shape, options);
  if (out.numel() > 0) formats::CopyToContiguous(view, static_cast<std::byte*>(out.data_ptr()));
  return out;
}

std::string ShapeText(const at::Tensor& t) { return "[" + absl::StrJoin(t.sizes(), ", ") + "]"; }

}  // namespace moerr::recorder
