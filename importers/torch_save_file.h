// A file torch.save wrote, read without running its pickle
// (TorchUnpickler): the zip format (the default since torch 1.6: data.pkl
// and one data/<key> record per storage, read with LibTorch's
// PyTorchStreamReader) or the legacy one (_use_new_zipfile_serialization=
// False: pickles, then each storage's element count and bytes, in one
// stream). Tensors are read one at a time, when asked for.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "importers/torch_unpickler.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace moerr::importers {

class TorchSaveFile {
 public:
  // Reads the file's pickle, not its tensors. InvalidArgument naming the
  // file for one that is not torch.save's (a tar of torch before 1.0, a
  // TorchScript archive, a big-endian file, a broken pickle); NotFound when
  // it cannot be opened.
  static absl::StatusOr<std::unique_ptr<TorchSaveFile>> Open(const std::string& path);
  ~TorchSaveFile();

  const PickleValue& root() const { return *root_; }
  bool legacy() const { return zip_ == nullptr; }

  // InvalidArgument unless `tensor` (a kTensor of root()) can be read: its
  // storage's record is present and holds every element its offset, sizes
  // and strides reach, of an element type LibTorch knows.
  absl::Status Check(const PickleValue& tensor);
  // `tensor`'s values, contiguous on the CPU. Check first.
  absl::StatusOr<at::Tensor> Read(const PickleValue& tensor);

  // A kStorage's element type ("Float" is kFloat).
  static absl::StatusOr<c10::ScalarType> ElementType(const PickleValue& storage);

 private:
  explicit TorchSaveFile(std::string path);
  absl::Status OpenZip();
  absl::Status OpenLegacy();
  absl::Status IndexLegacyStorages(size_t pos);
  absl::StatusOr<uint64_t> RecordBytes(const std::string& key);
  absl::StatusOr<at::Storage> StorageOf(const PickleValue& storage);

  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip_;  // null for the legacy format
  std::string bytes_;  // data.pkl, or the whole legacy file
  // Legacy format: each storage's bytes in bytes_ (offset, size), by key.
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> legacy_records_;
  TorchUnpickler unpickler_;
  const PickleValue* root_ = nullptr;
  // The storage read last: consecutive views of one storage read it once.
  std::string cached_key_;
  at::Storage cached_;
};

}  // namespace moerr::importers
