// Byte-level tensors: formats/ knows dtypes, shapes and bytes, never LibTorch,
// so it builds fast and fuzzes cheaply. The at::Tensor adapter lives with its
// users.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/dtype.h"

namespace moerr::formats {

// A borrowed view. `data` points at element [0, ..., 0]; `strides` are in
// elements (not bytes) and empty means contiguous row-major. The viewed memory
// must outlive the view.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  const std::byte* data = nullptr;
  // Optional: keeps `data` alive. A writer given an owner may hold on to it
  // and read the bytes later instead of copying them at the call.
  std::shared_ptr<const void> owner;

  bool IsContiguous() const;
};

// A tensor that owns its contiguous bytes.
struct OwnedTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;

  TensorView view() const { return TensorView{dtype, shape, {}, bytes.data(), nullptr}; }
};

// Product of `shape`; an error when a dimension is negative or the product
// (times `item_size`) overflows int64.
absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape, int item_size = 1);

// Copies the elements of `view` into `out` (numel * itemsize bytes) in row-major
// order, following its strides.
void CopyToContiguous(const TensorView& view, std::byte* out);

}  // namespace moerr::formats
