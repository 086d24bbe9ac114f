// safetensors read and write (the format of HF checkpoints), with the checks
// the safetensors library makes: header size cap, a JSON object header,
// known dtypes, data offsets contiguous, non-overlapping and covering the
// whole buffer, and end - begin == numel * itemsize.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/dtype.h"
#include "formats/tensor_view.h"

namespace llvm {
class MemoryBuffer;
}

namespace moerr::formats {

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;  // the library's cap

struct SafetensorsFile {
  std::shared_ptr<llvm::MemoryBuffer> buffer;  // views point into it
  std::vector<std::pair<std::string, TensorView>> tensors;  // in data order
  std::map<std::string, std::string> metadata;
};

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::shared_ptr<llvm::MemoryBuffer> buffer);

// A tensor as a header names it: the bytes follow elsewhere.
struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// The header of a file holding `entries` in this order, `nbytes[i]` bytes
// each: the 8-byte little-endian size, then the JSON object padded with
// spaces to a multiple of 8 bytes (so the data starts 8-byte aligned).
// `metadata` becomes __metadata__ when not empty.
std::string SafetensorsHeader(absl::Span<const TensorEntry> entries, absl::Span<const uint64_t> nbytes,
                              const std::map<std::string, std::string>& metadata);

// Writes tensors in the given order (strided views are made contiguous).
absl::Status WriteSafetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata = {}, bool overwrite = false);

}  // namespace moerr::formats
