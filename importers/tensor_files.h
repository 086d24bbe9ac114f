// Tensor files of dumps: .pt (torch.save, read by LibTorch's own loader,
// torch::pickle_load) and .npy (NumPy's format: a documented header and the
// raw bytes). Both come back as contiguous CPU tensors.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"

namespace moerr::importers {

// The whole file; NotFound / InvalidArgument naming it.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);

// What a .pt file holds, unpickled by LibTorch (torch::pickle_load). Its
// exceptions become InvalidArgument naming the file.
absl::StatusOr<c10::IValue> LoadPickle(const std::string& path);

// A .pt file holding one tensor (msprobe's tensor task writes one per value).
absl::StatusOr<at::Tensor> LoadPtTensor(const std::string& path);

// A .npy file: version 1.0, 2.0 or 3.0, little-endian or single-byte
// dtypes moerr stores (f8 f4 f2 i8 i4 i2 i1 u1 b1), C order.
absl::StatusOr<formats::OwnedTensor> ParseNpy(const std::string& bytes, const std::string& file);

// .pt or .npy by the file's extension.
absl::StatusOr<at::Tensor> LoadTensorFile(const std::string& path);

}  // namespace moerr::importers
