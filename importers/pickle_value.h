// A value a pickle builds, as the restricted unpickler reads it
// (torch_unpickler.h): plain data, and the few torch objects torch.save
// writes, described rather than rebuilt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moerr::importers {

struct PickleValue {
  enum class Kind : uint8_t {
    kNone, kBool, kInt, kFloat, kString, kBytes,
    kTuple, kList, kDict, kSet,
    kStorage,  // a persistent id ("storage", type, key, location, numel)
    kTensor,   // torch._utils._rebuild_tensor{,_v2}
    kGlobal,   // a class or function named by GLOBAL; text: "module.name"
    kObject,   // what a call of an unknown function or class made; text: what it is
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;  // kInt; kStorage: its numel, in elements of `text`'s type
  double number = 0;
  // kString (UTF-8) and kBytes: the value. kGlobal: "module.name". kObject:
  // the class or function behind it ("numpy.ndarray", "__main__.Config").
  // kStorage: the element type, LibTorch's name ("Float", "BFloat16"; "Byte"
  // for an UntypedStorage).
  std::string text;
  std::string key;  // kStorage: the record holding its bytes ("0" for data/0); numpy.dtype: its code
  std::string note;  // kObject: why it is not read, when there is more to say than its class
  // kTuple, kList, kSet: the elements. kDict: key, value, key, value... in
  // insertion order. kTensor: items[0] is its kStorage.
  std::vector<PickleValue*> items;
  // kTensor: offset into the storage, sizes and strides, in elements.
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
};

inline bool IsText(const PickleValue* v) {
  return v->kind == PickleValue::Kind::kString || v->kind == PickleValue::Kind::kBytes;
}

// "an int", "a dict", "a numpy.ndarray object": for messages.
std::string DescribeValue(const PickleValue& v);

}  // namespace moerr::importers
