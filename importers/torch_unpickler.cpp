#include "importers/torch_unpickler.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

using Kind = PickleValue::Kind;

// Opcodes of the binary pickle protocols (Python's Lib/pickle.py).
namespace op {
enum : uint8_t {
  kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2', kBinFloat = 'G', kBinInt = 'J',
  kBinInt1 = 'K', kBinInt2 = 'M', kNone = 'N', kBinPersId = 'Q', kReduce = 'R', kBinString = 'T',
  kShortBinString = 'U', kBinUnicode = 'X', kAppend = 'a', kBuild = 'b', kGlobal = 'c', kDict = 'd',
  kEmptyDict = '}', kAppends = 'e', kBinGet = 'h', kLongBinGet = 'j', kList = 'l', kEmptyList = ']',
  kBinPut = 'q', kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')', kSetItems = 'u',
  kBinBytes = 'B', kShortBinBytes = 'C', kProto = 0x80, kNewObj = 0x81, kTuple1 = 0x85, kTuple2 = 0x86,
  kTuple3 = 0x87, kNewTrue = 0x88, kNewFalse = 0x89, kLong1 = 0x8a, kLong4 = 0x8b, kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e, kEmptySet = 0x8f, kAddItems = 0x90, kFrozenSet = 0x91,
  kNewObjEx = 0x92, kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95, kByteArray8 = 0x96,
};
}  // namespace op

// Bounds on what a damaged or hostile file can make us hold.
constexpr size_t kMaxValues = size_t{1} << 24;
constexpr size_t kMaxStack = size_t{1} << 22;

// The pickle name of an opcode that names, calls or builds an object; null
// for the opcodes of plain data.
const char* ObjectOpcodeName(uint8_t opcode) {
  switch (opcode) {
    case op::kGlobal: return "GLOBAL";
    case op::kStackGlobal: return "STACK_GLOBAL";
    case op::kReduce: return "REDUCE";
    case op::kNewObj: return "NEWOBJ";
    case op::kNewObjEx: return "NEWOBJ_EX";
    case op::kBuild: return "BUILD";
    case op::kBinPersId: return "BINPERSID";
    default: return nullptr;
  }
}

}  // namespace

PickleValue* TorchUnpickler::New(Kind kind) {
  arena_.emplace_back();
  arena_.back().kind = kind;
  return &arena_.back();
}

absl::Status TorchUnpickler::Fail(absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat("byte ", op_at_, ": ", what));
}

absl::StatusOr<absl::string_view> TorchUnpickler::Read(size_t n) {
  if (n > data_.size() - pos_) return Fail("the pickle is cut short");
  const absl::string_view out = data_.substr(pos_, n);
  pos_ += n;
  return out;
}

template <typename T>
absl::StatusOr<T> TorchUnpickler::ReadLittle() {
  MOERR_ASSIGN_OR_RETURN(const absl::string_view bytes, Read(sizeof(T)));
  T v = 0;
  for (size_t i = sizeof(T); i-- > 0;) {
    v = static_cast<T>((static_cast<uint64_t>(v) << 8) | static_cast<uint8_t>(bytes[i]));
  }
  return v;
}

absl::Status TorchUnpickler::Push(PickleValue* v) {
  if (stack_.size() >= kMaxStack) return Fail(absl::StrCat("more than ", kMaxStack, " values on the stack"));
  stack_.push_back(v);
  return absl::OkStatus();
}

absl::StatusOr<PickleValue*> TorchUnpickler::Pop() {
  if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) return Fail("pops an empty stack");
  PickleValue* v = stack_.back();
  stack_.pop_back();
  return v;
}

absl::StatusOr<std::vector<PickleValue*>> TorchUnpickler::PopN(size_t n) {
  std::vector<PickleValue*> items(n);
  for (size_t i = n; i-- > 0;) {
    MOERR_ASSIGN_OR_RETURN(items[i], Pop());
  }
  return items;
}

absl::StatusOr<PickleValue*> TorchUnpickler::Top() {
  if (stack_.empty()) return Fail("reads an empty stack");
  return stack_.back();
}

absl::StatusOr<std::vector<PickleValue*>> TorchUnpickler::PopMark() {
  if (marks_.empty()) return Fail("closes a MARK that was never set");
  const size_t start = marks_.back();
  marks_.pop_back();
  std::vector<PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(start), stack_.end());
  stack_.resize(start);
  return items;
}

absl::StatusOr<const PickleValue*> TorchUnpickler::Load(absl::string_view data, size_t& pos) {
  data_ = data;
  pos_ = pos;
  stack_.clear();
  marks_.clear();
  memo_.clear();
  memo_count_ = 0;
  while (true) {
    op_at_ = pos_;
    MOERR_ASSIGN_OR_RETURN(const absl::string_view code, Read(1));
    const uint8_t opcode = static_cast<uint8_t>(code[0]);
    if (opcode == op::kStop) break;
    if (arena_.size() > kMaxValues) return Fail(absl::StrCat("more than ", kMaxValues, " values"));
    bool done = false;
    if (opcode == op::kProto) {
      MOERR_ASSIGN_OR_RETURN(const uint8_t protocol, ReadLittle<uint8_t>());
      if (protocol < 2 || protocol > 5) {
        return Fail(absl::StrCat("pickle protocol ", protocol, " is not read (2 to 5 are)"));
      }
      done = true;
    } else if (opcode == op::kFrame) {
      MOERR_RETURN_IF_ERROR(ReadLittle<uint64_t>().status());  // a length hint only
      done = true;
    }
    for (auto group : {&TorchUnpickler::ScalarOp, &TorchUnpickler::LengthOp, &TorchUnpickler::ContainerOp,
                       &TorchUnpickler::ObjectOp, &TorchUnpickler::MemoOp}) {
      if (done) break;
      MOERR_ASSIGN_OR_RETURN(done, (this->*group)(opcode));
    }
    if (!done) {
      return Fail(absl::StrFormat("opcode 0x%02x is not one of pickle protocols 2 to 5 (torch.save writes protocol 2 "
                                  "unless told otherwise)", opcode));
    }
  }
  if (stack_.size() != 1 || !marks_.empty()) {
    return Fail(absl::StrCat("the pickle ends with ", stack_.size(), " values on its stack, not 1"));
  }
  pos = pos_;
  return stack_.back();
}

absl::Status TorchUnpickler::PushString(size_t length, Kind kind) {
  MOERR_ASSIGN_OR_RETURN(const absl::string_view bytes, Read(length));
  PickleValue* v = New(kind);
  v->text = std::string(bytes);
  return Push(v);
}

// LONG1 and LONG4: `length` bytes of a little-endian two's complement integer.
absl::Status TorchUnpickler::PushLong(size_t length) {
  MOERR_ASSIGN_OR_RETURN(const absl::string_view bytes, Read(length));
  if (length > 8) {
    PickleValue* v = New(Kind::kObject);
    v->text = "int";
    v->note = absl::StrCat("an int of ", length, " bytes, wider than 64 bits");
    return Push(v);
  }
  uint64_t u = 0;
  for (size_t i = length; i-- > 0;) u = (u << 8) | static_cast<uint8_t>(bytes[i]);
  if (length > 0 && length < 8 && (static_cast<uint8_t>(bytes[length - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * length);
  PickleValue* v = New(Kind::kInt);
  v->integer = static_cast<int64_t>(u);
  return Push(v);
}

absl::StatusOr<bool> TorchUnpickler::ScalarOp(uint8_t opcode) {
  PickleValue* v = nullptr;
  switch (opcode) {
    case op::kNone: v = New(Kind::kNone); break;
    case op::kNewTrue:
    case op::kNewFalse:
      v = New(Kind::kBool);
      v->boolean = opcode == op::kNewTrue;
      break;
    case op::kBinInt: {
      MOERR_ASSIGN_OR_RETURN(const uint32_t i, ReadLittle<uint32_t>());
      v = New(Kind::kInt);
      v->integer = static_cast<int32_t>(i);
      break;
    }
    case op::kBinInt1: {
      MOERR_ASSIGN_OR_RETURN(const uint8_t i, ReadLittle<uint8_t>());
      v = New(Kind::kInt);
      v->integer = i;
      break;
    }
    case op::kBinInt2: {
      MOERR_ASSIGN_OR_RETURN(const uint16_t i, ReadLittle<uint16_t>());
      v = New(Kind::kInt);
      v->integer = i;
      break;
    }
    case op::kBinFloat: {
      MOERR_ASSIGN_OR_RETURN(const absl::string_view b, Read(8));
      uint64_t bits = 0;
      for (char c : b) bits = (bits << 8) | static_cast<uint8_t>(c);  // big-endian
      v = New(Kind::kFloat);
      std::memcpy(&v->number, &bits, sizeof bits);
      break;
    }
    default: return false;
  }
  MOERR_RETURN_IF_ERROR(Push(v));
  return true;
}

// Integers of LONG1 / LONG4, strings and bytes: a little-endian length of
// `width` bytes, then that many bytes.
absl::StatusOr<bool> TorchUnpickler::LengthOp(uint8_t opcode) {
  size_t width = 0;
  Kind kind = Kind::kString;
  switch (opcode) {
    case op::kLong1: width = 1, kind = Kind::kInt; break;
    case op::kLong4: width = 4, kind = Kind::kInt; break;
    case op::kShortBinUnicode:
    case op::kShortBinString: width = 1; break;
    case op::kBinUnicode:
    case op::kBinString: width = 4; break;
    case op::kBinUnicode8: width = 8; break;
    case op::kShortBinBytes: width = 1, kind = Kind::kBytes; break;
    case op::kBinBytes: width = 4, kind = Kind::kBytes; break;
    case op::kBinBytes8:
    case op::kByteArray8: width = 8, kind = Kind::kBytes; break;
    default: return false;
  }
  MOERR_ASSIGN_OR_RETURN(const absl::string_view length_bytes, Read(width));
  uint64_t n = 0;
  for (size_t i = width; i-- > 0;) n = (n << 8) | static_cast<uint8_t>(length_bytes[i]);
  if (width == 4 && (n & 0x80000000u) != 0) return Fail("a negative length");  // LONG4, BINSTRING: signed
  MOERR_RETURN_IF_ERROR(kind == Kind::kInt ? PushLong(n) : PushString(n, kind));
  return true;
}

absl::Status TorchUnpickler::AddToContainer(PickleValue* container, const std::vector<PickleValue*>& items) {
  switch (container->kind) {
    case Kind::kList:
    case Kind::kSet: break;
    case Kind::kDict:
      if (items.size() % 2 != 0) return Fail("sets a dict item without its value");
      break;
    case Kind::kObject: return absl::OkStatus();  // what an unknown class would hold: not read
    default: return Fail(absl::StrCat("adds items to ", DescribeValue(*container)));
  }
  container->items.insert(container->items.end(), items.begin(), items.end());
  return absl::OkStatus();
}

absl::StatusOr<bool> TorchUnpickler::ContainerOp(uint8_t opcode) {
  static constexpr std::pair<uint8_t, Kind> kEmpty[] = {
      {op::kEmptyTuple, Kind::kTuple}, {op::kEmptyList, Kind::kList}, {op::kEmptyDict, Kind::kDict},
      {op::kEmptySet, Kind::kSet}};
  for (const auto& [code, kind] : kEmpty) {
    if (opcode != code) continue;
    MOERR_RETURN_IF_ERROR(Push(New(kind)));
    return true;
  }
  static constexpr std::pair<uint8_t, Kind> kFromMark[] = {
      {op::kTuple, Kind::kTuple}, {op::kList, Kind::kList}, {op::kDict, Kind::kDict}, {op::kFrozenSet, Kind::kSet}};
  for (const auto& [code, kind] : kFromMark) {
    if (opcode != code) continue;
    MOERR_ASSIGN_OR_RETURN(std::vector<PickleValue*> items, PopMark());
    if (kind == Kind::kDict && items.size() % 2 != 0) return Fail("makes a dict of a key without its value");
    PickleValue* v = New(kind);
    v->items = std::move(items);
    MOERR_RETURN_IF_ERROR(Push(v));
    return true;
  }
  switch (opcode) {
    case op::kMark: marks_.push_back(stack_.size()); return true;
    case op::kPop: MOERR_RETURN_IF_ERROR(Pop().status()); return true;
    case op::kPopMark: MOERR_RETURN_IF_ERROR(PopMark().status()); return true;
    case op::kDup: { MOERR_ASSIGN_OR_RETURN(PickleValue* top, Top()); MOERR_RETURN_IF_ERROR(Push(top)); return true; }
    case op::kTuple1:
    case op::kTuple2:
    case op::kTuple3: {
      MOERR_ASSIGN_OR_RETURN(std::vector<PickleValue*> items, PopN(opcode - op::kTuple1 + 1));
      PickleValue* v = New(Kind::kTuple);
      v->items = std::move(items);
      MOERR_RETURN_IF_ERROR(Push(v));
      return true;
    }
    case op::kAppend:
    case op::kSetItem: {
      MOERR_ASSIGN_OR_RETURN(const std::vector<PickleValue*> items, PopN(opcode == op::kAppend ? 1 : 2));
      MOERR_ASSIGN_OR_RETURN(PickleValue* container, Top());
      MOERR_RETURN_IF_ERROR(AddToContainer(container, items));
      return true;
    }
    case op::kAppends:
    case op::kSetItems:
    case op::kAddItems: {
      MOERR_ASSIGN_OR_RETURN(const std::vector<PickleValue*> items, PopMark());
      MOERR_ASSIGN_OR_RETURN(PickleValue* container, Top());
      MOERR_RETURN_IF_ERROR(AddToContainer(container, items));
      return true;
    }
    default: return false;
  }
}

absl::StatusOr<bool> TorchUnpickler::ObjectOp(uint8_t opcode) {
  if (plain_data_only_) {
    if (const char* name = ObjectOpcodeName(opcode)) {
      return Fail(absl::StrCat(name, " builds an object: only plain data (dicts, lists, tuples, strings, numbers, "
                               "booleans, None) is read from this file"));
    }
  }
  PickleValue* result = nullptr;
  switch (opcode) {
    case op::kGlobal: {  // "module\nname\n"
      const size_t module_end = data_.find('\n', pos_);
      const size_t name_end = module_end == absl::string_view::npos ? module_end : data_.find('\n', module_end + 1);
      if (name_end == absl::string_view::npos) return Fail("the pickle is cut short");
      result = New(Kind::kGlobal);
      result->text = absl::StrCat(data_.substr(pos_, module_end - pos_), ".",
                                  data_.substr(module_end + 1, name_end - module_end - 1));
      pos_ = name_end + 1;
      break;
    }
    case op::kStackGlobal: {
      MOERR_ASSIGN_OR_RETURN(const PickleValue* name, Pop());
      MOERR_ASSIGN_OR_RETURN(const PickleValue* module, Pop());
      if (!IsText(name) || !IsText(module)) return Fail("STACK_GLOBAL of names that are not strings");
      result = New(Kind::kGlobal);
      result->text = absl::StrCat(module->text, ".", name->text);
      break;
    }
    case op::kReduce: {
      MOERR_ASSIGN_OR_RETURN(const PickleValue* args, Pop());
      MOERR_ASSIGN_OR_RETURN(const PickleValue* callable, Pop());
      MOERR_ASSIGN_OR_RETURN(result, Call(*callable, *args));
      break;
    }
    case op::kNewObj:
    case op::kNewObjEx: {
      if (opcode == op::kNewObjEx) MOERR_RETURN_IF_ERROR(Pop().status());  // keyword arguments
      MOERR_RETURN_IF_ERROR(Pop().status());                               // arguments
      MOERR_ASSIGN_OR_RETURN(const PickleValue* cls, Pop());
      result = Construct(cls->kind == Kind::kGlobal ? cls->text : DescribeValue(*cls));
      break;
    }
    case op::kBuild:
      // The state of the object below it: an OrderedDict's attributes (a
      // state_dict's _metadata), an object's fields. Neither is read.
      MOERR_RETURN_IF_ERROR(Pop().status());
      MOERR_RETURN_IF_ERROR(Top().status());
      return true;
    case op::kBinPersId: {
      MOERR_ASSIGN_OR_RETURN(const PickleValue* pid, Pop());
      MOERR_ASSIGN_OR_RETURN(result, PersistentId(*pid));
      break;
    }
    default: return false;
  }
  MOERR_RETURN_IF_ERROR(Push(result));
  return true;
}

absl::StatusOr<bool> TorchUnpickler::MemoOp(uint8_t opcode) {
  uint32_t index = 0;
  switch (opcode) {
    case op::kBinPut:
    case op::kBinGet: { MOERR_ASSIGN_OR_RETURN(index, ReadLittle<uint8_t>()); break; }
    case op::kLongBinPut:
    case op::kLongBinGet: { MOERR_ASSIGN_OR_RETURN(index, ReadLittle<uint32_t>()); break; }
    case op::kMemoize: index = static_cast<uint32_t>(memo_count_); break;  // Python: len(memo)
    default: return false;
  }
  if (opcode == op::kBinGet || opcode == op::kLongBinGet) {
    if (index >= memo_.size() || memo_[index] == nullptr) {
      return Fail(absl::StrCat("reads memo ", index, ", which was never set"));
    }
    MOERR_RETURN_IF_ERROR(Push(memo_[index]));
    return true;
  }
  // Picklers number the memo densely from 0; a vector indexed by it, capped
  // as the values are, keeps a hostile index from costing more.
  if (index >= kMaxValues) return Fail(absl::StrCat("sets memo ", index, ", past ", kMaxValues));
  if (index >= memo_.size()) memo_.resize(size_t{index} + 1, nullptr);
  if (memo_[index] == nullptr) ++memo_count_;
  MOERR_ASSIGN_OR_RETURN(memo_[index], Top());
  return true;
}

}  // namespace moerr::importers
