// Tensor files of dumps: .pt (torch.save, read by TorchSaveFile,
// torch_save_file.h) and .npy (NumPy's format: a documented header and the
// raw bytes). Both come back as contiguous CPU tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"

namespace moerr::importers {

// The file, or its first `limit` bytes; NotFound / InvalidArgument naming it.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path, size_t limit = SIZE_MAX);

// A .pt file holding one tensor (msprobe's tensor task writes one per value).
absl::StatusOr<at::Tensor> LoadPtTensor(const std::string& path);

// A .npy file: version 1.0, 2.0 or 3.0, little-endian or single-byte
// dtypes moerr stores (f8 f4 f2 i8 i4 i2 i1 u1 b1), C order.
absl::StatusOr<formats::OwnedTensor> ParseNpy(const std::string& bytes, const std::string& file);

// .pt or .npy by the file's extension.
absl::StatusOr<at::Tensor> LoadTensorFile(const std::string& path);

}  // namespace moerr::importers
