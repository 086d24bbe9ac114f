// Token ids a user gives moerr (moerr forward --tokens, moerr proxy
// --checkpoint --tokens): a safetensors file with an integer `input_ids`
// tensor [B, T] (or [T]), or a text file of one sequence per non-blank line,
// ids separated by commas or white space.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moerr::proxy {

// Ids separated by commas or white space; `where` names the source in errors.
absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, const std::string& where);
// Rows of equal, non-zero length as a [B, T] int64 tensor.
absl::StatusOr<at::Tensor> FromRows(const std::vector<std::vector<int64_t>>& rows, const std::string& where);
// Tensor `name` of the safetensors file at `path`, copied out of the map
// (NotFound naming the tensors it holds).
absl::StatusOr<at::Tensor> ReadNamedTensor(const std::string& path, const std::string& name);
// input_ids [B, T] (or [T]) of an integer dtype in the safetensors file at `path`, as int64 [B, T].
absl::StatusOr<at::Tensor> ReadInputIds(const std::string& path);
// A `.safetensors` file's input_ids, else a text file's lines, as int64 [B, T].
absl::StatusOr<at::Tensor> ReadTokenFile(const std::string& path);

}  // namespace moerr::proxy
