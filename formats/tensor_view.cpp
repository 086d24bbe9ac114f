#include "formats/tensor_view.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "support/check.h"

namespace moerr::formats {

bool TensorView::IsContiguous() const {
  if (strides.empty()) return true;
  MOERR_CHECK(strides.size() == shape.size()) << strides.size() << " strides for rank " << shape.size();
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape, int item_size) {
  int64_t numel = item_size;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return absl::InvalidArgumentError(absl::StrCat("dimension ", i, " is negative: ", shape[i]));
    if (__builtin_mul_overflow(numel, shape[i], &numel)) {
      return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(shape, ", "),
                                                     "] overflows int64 elements"));
    }
  }
  return numel;
}

namespace {

// Copies dimension `dim` onwards; the innermost dimension is a strided loop
// (or one memcpy when its stride is 1).
void CopyDim(const TensorView& v, size_t dim, const std::byte* src, std::byte*& out, size_t item) {
  const int64_t n = v.shape[dim];
  const int64_t stride_bytes = v.strides[dim] * static_cast<int64_t>(item);
  if (dim + 1 == v.shape.size()) {
    if (v.strides[dim] == 1) {
      std::memcpy(out, src, n * item);
      out += n * item;
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out, src + i * stride_bytes, item);
      out += item;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) CopyDim(v, dim + 1, src + i * stride_bytes, out, item);
}

}  // namespace

void CopyToContiguous(const TensorView& view, std::byte* out) {
  const size_t item = ItemSize(view.dtype);
  const int64_t numel = CheckedNumel(view.shape).value();
  if (numel == 0) return;
  if (view.IsContiguous()) {
    std::memcpy(out, view.data, numel * item);
    return;
  }
  if (view.shape.empty()) {
    std::memcpy(out, view.data, item);
    return;
  }
  CopyDim(view, 0, view.data, out, item);
}

}  // namespace moerr::formats
