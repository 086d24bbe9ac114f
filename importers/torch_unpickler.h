// A restricted unpickler for what torch.save writes (the opcodes of pickle
// protocols 2 to 5, as torch/_weights_only_unpickler.py reads them). It runs
// no code and imports nothing: a call of a function it does not know becomes
// an opaque value naming that function or class, so the rest of the file
// still reads. Tensors come back as descriptions (storage, offset, sizes,
// strides), never as bytes; TorchSaveFile (torch_save_file.h) reads those.
// Needs no LibTorch, so it can be parsed and fuzzed on its own.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "importers/pickle_value.h"

namespace moerr::importers {

class TorchUnpickler {
 public:
  // `plain_data_only`: refuse every opcode that names a class or function,
  // calls one or builds an object (GLOBAL, STACK_GLOBAL, REDUCE, NEWOBJ,
  // NEWOBJ_EX, BUILD, BINPERSID), so that only dicts, lists, tuples, sets,
  // strings, bytes, numbers, booleans and None come back. What a Flight
  // Recorder dump holds (flight_recorder_dump.h).
  explicit TorchUnpickler(bool plain_data_only = false) : plain_data_only_(plain_data_only) {}

  // Reads one pickle of `data` from `pos` to its STOP opcode and returns the
  // object it builds; `pos` is left after STOP. Values live as long as this
  // unpickler. InvalidArgument ("data.pkl byte N: ...") for anything that is
  // not a well-formed pickle: a cut-short file, an unknown opcode, a stack or
  // memo used out of range.
  absl::StatusOr<const PickleValue*> Load(absl::string_view data, size_t& pos);

  // Every storage a persistent id named, by key (one value per key).
  const absl::flat_hash_map<std::string, PickleValue*>& storages() const { return storages_; }

 private:
  PickleValue* New(PickleValue::Kind kind);
  absl::Status Fail(absl::string_view what) const;
  absl::StatusOr<absl::string_view> Read(size_t n);
  template <typename T>
  absl::StatusOr<T> ReadLittle();
  absl::StatusOr<PickleValue*> Pop();
  absl::StatusOr<std::vector<PickleValue*>> PopN(size_t n);  // in stack order
  absl::StatusOr<PickleValue*> Top();
  absl::StatusOr<std::vector<PickleValue*>> PopMark();  // the values above the last MARK
  absl::Status Push(PickleValue* v);

  // Each runs `op` when it is one of its group's, and says whether it was.
  absl::StatusOr<bool> ScalarOp(uint8_t op);
  absl::StatusOr<bool> LengthOp(uint8_t op);
  absl::StatusOr<bool> ContainerOp(uint8_t op);
  absl::StatusOr<bool> ObjectOp(uint8_t op);
  absl::StatusOr<bool> MemoOp(uint8_t op);
  absl::Status PushString(size_t length, PickleValue::Kind kind);
  absl::Status PushLong(size_t length);
  absl::Status AddToContainer(PickleValue* container, const std::vector<PickleValue*>& items);

  absl::StatusOr<PickleValue*> Call(const PickleValue& callable, const PickleValue& args);
  PickleValue* Construct(const std::string& cls);
  absl::StatusOr<PickleValue*> RebuildTensor(const std::string& function, const PickleValue& args);
  absl::StatusOr<PickleValue*> PersistentId(const PickleValue& pid);
  PickleValue* NumpyScalar(const PickleValue& args);

  std::deque<PickleValue> arena_;  // owns every value; the deque keeps their addresses
  absl::flat_hash_map<std::string, PickleValue*> storages_;
  // The current pickle's state.
  absl::string_view data_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<PickleValue*> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK
  std::vector<PickleValue*> memo_;  // by index; null: not set
  size_t memo_count_ = 0;           // memo entries set
  int call_depth_ = 0;
  bool plain_data_only_ = false;
};

}  // namespace moerr::importers
