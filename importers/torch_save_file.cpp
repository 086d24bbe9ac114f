#include "importers/torch_save_file.h"

#include <ATen/ops/empty.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "importers/tensor_files.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

using Kind = PickleValue::Kind;

// The first pickle of the legacy format: PROTO 2, then LONG1 of 10 bytes
// holding torch/serialization.py's MAGIC_NUMBER 0x1950a86a20f9469cfc6c.
constexpr absl::string_view kLegacyMagic("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14);
constexpr int64_t kLegacyProtocolVersion = 1001;

// LibTorch's message, less the backtrace it appends.
std::string FirstLine(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// The value of string key `key` in a dict; nullptr when absent.
const PickleValue* Member(const PickleValue& dict, absl::string_view key) {
  for (size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    if (dict.items[i]->kind == Kind::kString && dict.items[i]->text == key) return dict.items[i + 1];
  }
  return nullptr;
}

// Multiplies and adds in int64, false on overflow.
bool MulAdd(int64_t a, int64_t b, int64_t& acc) {
  int64_t product = 0;
  return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(acc, product, &acc);
}

}  // namespace

TorchSaveFile::TorchSaveFile(std::string path) : path_(std::move(path)) {}
TorchSaveFile::~TorchSaveFile() = default;

absl::StatusOr<std::unique_ptr<TorchSaveFile>> TorchSaveFile::Open(const std::string& path) {
  std::unique_ptr<TorchSaveFile> file(new TorchSaveFile(path));
  const absl::StatusOr<std::string> start = ReadFileBytes(path, 512);
  if (!start.ok()) return start.status();
  const absl::string_view head = *start;
  absl::Status status;
  if (absl::StartsWith(head, "PK\x03\x04")) {
    status = file->OpenZip();
  } else if (absl::StartsWith(head, kLegacyMagic)) {
    status = file->OpenLegacy();
  } else if (head.size() >= 262 && head.substr(257, 5) == "ustar") {
    status = absl::InvalidArgumentError("a tar archive (torch.save of torch before 1.0) is not read; load and save it "
                                        "again with a newer torch");
  } else {
    status = absl::InvalidArgumentError("not a file torch.save wrote (neither its zip format nor its legacy one)");
  }
  MOERR_RETURN_IF_ERROR(Annotate(status, path));
  return file;
}

absl::Status TorchSaveFile::OpenZip() {
  try {
    zip_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path_);
    if (zip_->hasRecord("byteorder")) {
      const auto [data, size] = zip_->getRecord("byteorder");
      const std::string order(static_cast<const char*>(data.get()), size);
      if (order != "little") return absl::InvalidArgumentError(absl::StrCat("written ", order, "-endian; not read"));
    }
    if (!zip_->hasRecord("data.pkl")) {
      return absl::InvalidArgumentError(zip_->hasRecord("constants.pkl")
                                            ? "a TorchScript archive (torch.jit.save), not a torch.save file"
                                            : "a zip archive without data.pkl: not a file torch.save wrote");
    }
    const auto [data, size] = zip_->getRecord("data.pkl");
    bytes_.assign(static_cast<const char*>(data.get()), size);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a zip archive LibTorch can read: ", FirstLine(e)));
  }
  size_t pos = 0;
  absl::StatusOr<const PickleValue*> root = unpickler_.Load(bytes_, pos);
  if (!root.ok()) return Annotate(root.status(), "data.pkl");
  root_ = *root;
  return absl::OkStatus();
}

// Pickles of the magic number, the protocol version, the machine (byte
// order, type sizes), the object, the storage keys; then each storage.
absl::Status TorchSaveFile::OpenLegacy() {
  MOERR_ASSIGN_OR_RETURN(bytes_, ReadFileBytes(path_));
  size_t pos = kLegacyMagic.size() + 1;  // past the magic pickle's STOP
  MOERR_ASSIGN_OR_RETURN(const PickleValue* version, unpickler_.Load(bytes_, pos));
  if (version->kind != Kind::kInt || version->integer != kLegacyProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat("legacy torch.save format: protocol version ",
                                                   DescribeValue(*version), " is not ", kLegacyProtocolVersion));
  }
  MOERR_ASSIGN_OR_RETURN(const PickleValue* sys_info, unpickler_.Load(bytes_, pos));
  const PickleValue* little = sys_info->kind == Kind::kDict ? Member(*sys_info, "little_endian") : nullptr;
  if (little == nullptr || little->kind != Kind::kBool || !little->boolean) {
    return absl::InvalidArgumentError(
        "legacy torch.save format written big-endian (or without its byte order); not read");
  }
  MOERR_ASSIGN_OR_RETURN(root_, unpickler_.Load(bytes_, pos));
  return IndexLegacyStorages(pos);
}

// After the object: the list of storage keys, then for each key in that
// order its element count (int64, little-endian) and its bytes.
absl::Status TorchSaveFile::IndexLegacyStorages(size_t pos) {
  MOERR_ASSIGN_OR_RETURN(const PickleValue* keys, unpickler_.Load(bytes_, pos));
  if (keys->kind != Kind::kList) return absl::InvalidArgumentError("legacy torch.save format: no list of storage keys");
  for (const PickleValue* key : keys->items) {
    const auto it = key->kind == Kind::kString ? unpickler_.storages().find(key->text) : unpickler_.storages().end();
    if (it == unpickler_.storages().end()) {
      return absl::InvalidArgumentError(absl::StrCat("legacy torch.save format: storage key ", DescribeValue(*key),
                                                     " names no storage of the object"));
    }
    MOERR_ASSIGN_OR_RETURN(const c10::ScalarType type, ElementType(*it->second));
    int64_t count = 0;
    const absl::Status cut = absl::InvalidArgumentError(absl::StrCat("storage ", key->text, " is cut short"));
    if (bytes_.size() - pos < 8) return cut;
    std::memcpy(&count, bytes_.data() + pos, 8);
    int64_t size = 0;
    if (count < 0 || !MulAdd(count, static_cast<int64_t>(c10::elementSize(type)), size) ||
        static_cast<uint64_t>(size) > bytes_.size() - pos - 8) {
      return cut;
    }
    legacy_records_[key->text] = {pos + 8, static_cast<size_t>(size)};
    pos += 8 + static_cast<size_t>(size);
  }
  return absl::OkStatus();
}

absl::StatusOr<c10::ScalarType> TorchSaveFile::ElementType(const PickleValue& storage) {
#define MOERR_STORAGE_TYPE(_, name) \
  if (storage.text == #name) return c10::ScalarType::name;
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(MOERR_STORAGE_TYPE)
#undef MOERR_STORAGE_TYPE
  return absl::InvalidArgumentError(absl::StrCat("its storage is a torch.", storage.text, "Storage, a class LibTorch "
                                                 "does not know"));
}

absl::StatusOr<uint64_t> TorchSaveFile::RecordBytes(const std::string& key) {
  if (legacy()) {
    const auto it = legacy_records_.find(key);
    if (it == legacy_records_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("its storage ", key, " is missing"));
    }
    return it->second.second;
  }
  const std::string name = absl::StrCat("data/", key);
  try {
    if (!zip_->hasRecord(name)) {
      return absl::InvalidArgumentError(absl::StrCat("its storage record ", name, " is missing"));
    }
    return zip_->getRecordSize(name);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("its storage record ", name, ": ", FirstLine(e)));
  }
}

absl::Status TorchSaveFile::Check(const PickleValue& tensor) {
  const PickleValue& storage = *tensor.items.at(0);
  MOERR_ASSIGN_OR_RETURN(const c10::ScalarType type, ElementType(storage));
  MOERR_ASSIGN_OR_RETURN(const uint64_t bytes, RecordBytes(storage.key));
  const int64_t item = static_cast<int64_t>(c10::elementSize(type));
  int64_t need = 0;
  if (!MulAdd(storage.integer, item, need) || static_cast<uint64_t>(need) > bytes) {
    return absl::InvalidArgumentError(absl::StrCat("its storage ", storage.key, " holds ", bytes, " bytes, fewer than ",
                                                   storage.integer, " elements of ", storage.text));
  }
  // The last element reached: offset + sum of (size - 1) * stride.
  int64_t last = tensor.offset;
  bool empty = false;
  for (size_t d = 0; d < tensor.sizes.size(); ++d) {
    if (tensor.sizes[d] < 0 || tensor.strides[d] < 0) {
      return absl::InvalidArgumentError("a negative size or stride");
    }
    empty |= tensor.sizes[d] == 0;
    if (tensor.sizes[d] > 0 && !MulAdd(tensor.sizes[d] - 1, tensor.strides[d], last)) {
      return absl::InvalidArgumentError("sizes and strides past 64 bits");
    }
  }
  if (tensor.offset < 0 || (!empty && last >= storage.integer)) {
    return absl::InvalidArgumentError(absl::StrCat("reaches element ", last, " of its storage ", storage.key,
                                                   ", which holds ", storage.integer));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Storage> TorchSaveFile::StorageOf(const PickleValue& storage) {
  if (cached_key_ == storage.key && cached_) return cached_;
  MOERR_ASSIGN_OR_RETURN(const uint64_t size, RecordBytes(storage.key));
  at::Tensor raw = at::empty({static_cast<int64_t>(size)}, at::kByte);
  if (legacy()) {
    std::memcpy(raw.data_ptr(), bytes_.data() + legacy_records_.at(storage.key).first, size);
  } else {
    try {
      zip_->getRecord(absl::StrCat("data/", storage.key), raw.data_ptr(), size);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("its storage record data/", storage.key, ": ", FirstLine(e)));
    }
  }
  cached_key_ = storage.key;
  cached_ = raw.storage();
  return cached_;
}

absl::StatusOr<at::Tensor> TorchSaveFile::Read(const PickleValue& tensor) {
  const PickleValue& storage = *tensor.items.at(0);
  MOERR_ASSIGN_OR_RETURN(const c10::ScalarType type, ElementType(storage));
  const at::TensorOptions options = at::TensorOptions().dtype(type);
  for (int64_t size : tensor.sizes) {
    if (size == 0) return at::empty(tensor.sizes, options);
  }
  MOERR_ASSIGN_OR_RETURN(at::Storage bytes, StorageOf(storage));
  return at::empty({0}, options).set_(bytes, tensor.offset, tensor.sizes, tensor.strides).contiguous();
}

}  // namespace moerr::importers
