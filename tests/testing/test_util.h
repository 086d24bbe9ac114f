// Helpers shared by the formats tests and the fuzz corpus generator.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/bundle_index.h"
#include "formats/tensor_view.h"

namespace moerr::formats::testing {

// A fresh directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic pseudo-random contents for `dtype` (weights-like N(0, 0.02)
// for floats, small integers otherwise).
OwnedTensor RandomTensor(DType dtype, std::vector<int64_t> shape, uint64_t seed);

// A view of `v`'s bytes as `dtype` (shape: [v.size()] unless given); `v`
// must outlive it.
template <typename T>
TensorView VectorView(const std::vector<T>& v, DType dtype, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return TensorView{dtype, std::move(shape), {}, reinterpret_cast<const std::byte*>(v.data()), nullptr};
}

std::vector<std::byte> ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::vector<std::byte>& bytes);

// Writes a small bundle with two steps, a few dtypes, a duplicate tensor and
// an annotation; returns its bytes. `chunk_bytes` small makes many chunks.
std::vector<std::byte> MakeSampleBundle(const std::string& path, uint64_t chunk_bytes = 4096);

// Replaces the index of a finished bundle with `index` bytes and a matching
// footer, so a test reaches the index decoder with a payload of its choice.
std::vector<std::byte> WithIndex(std::vector<std::byte> file, const std::vector<std::byte>& index);
// Appends an index frame holding `index` and a matching footer to `data`
// (a superblock and complete frames).
std::vector<std::byte> AppendIndex(std::vector<std::byte> data, const std::vector<std::byte>& index);

}  // namespace moerr::formats::testing
