// at::Tensor <-> formats' byte-level tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"

namespace moerr::recorder {

absl::StatusOr<formats::DType> ToDType(at::ScalarType type);
at::ScalarType ToScalarType(formats::DType dtype);

// A view of a CPU tensor's elements (strides kept); the view holds a
// reference to the tensor, so a writer may read it after the call.
absl::StatusOr<formats::TensorView> ViewOf(const at::Tensor& t);
// A new tensor holding a copy of `view`'s elements.
at::Tensor ToTensor(const formats::TensorView& view);

// "[2, 3]": `t`'s sizes, as error messages name a shape.
std::string ShapeText(const at::Tensor& t);

}  // namespace moerr::recorder
