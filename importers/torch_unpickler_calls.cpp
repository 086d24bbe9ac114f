// TorchUnpickler's calls (torch_unpickler.h): what the classes and
// functions a torch.save pickle names become, described rather than run.
// torch's rebuild functions make tensor descriptions, a persistent id a
// storage, a few builtins (bytes, OrderedDict, numpy scalars) plain values;
// anything else an opaque object naming its class.
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "importers/torch_unpickler.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

using Kind = PickleValue::Kind;

constexpr int kMaxCallDepth = 8;  // _rebuild_from_type_v2 nests one call in another

// Python's latin-1 encoding of a UTF-8 string (protocol 2 pickles bytes as
// _codecs.encode(str, "latin1")); a code point past 0xFF is kept as is.
std::string Latin1(absl::string_view utf8) {
  std::string out;
  for (size_t i = 0; i < utf8.size(); ++i) {
    const uint8_t c = static_cast<uint8_t>(utf8[i]);
    if ((c == 0xC2 || c == 0xC3) && i + 1 < utf8.size()) {
      out.push_back(static_cast<char>(((c & 0x03) << 6) | (static_cast<uint8_t>(utf8[++i]) & 0x3F)));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

}  // namespace

// What NEWOBJ makes of class `cls` (protocol 2 pickles most objects so).
PickleValue* TorchUnpickler::Construct(const std::string& cls) {
  if (cls == "collections.OrderedDict" || cls == "collections.defaultdict" || cls == "builtins.dict") {
    return New(Kind::kDict);
  }
  if (cls == "builtins.list") return New(Kind::kList);
  if (cls == "builtins.set" || cls == "builtins.frozenset") return New(Kind::kSet);
  PickleValue* v = New(Kind::kObject);
  v->text = cls;
  if (absl::StartsWith(cls, "torch.nn.modules.")) {
    v->note = absl::StrCat("a ", cls, " object (torch.save of a whole module: save its state_dict() instead)");
  }
  return v;
}

// REDUCE: `callable(*args)` for the functions torch.save's files call; any
// other call becomes an opaque value naming the function (or the class an
// object reconstructor names).
absl::StatusOr<PickleValue*> TorchUnpickler::Call(const PickleValue& callable, const PickleValue& args) {
  const std::string& f = callable.text;
  const std::vector<PickleValue*>& a = args.items;
  if (callable.kind != Kind::kGlobal || args.kind != Kind::kTuple) {
    return Construct(callable.kind == Kind::kGlobal ? f : DescribeValue(callable));
  }
  if (f == "collections.OrderedDict" || f == "builtins.dict" || f == "builtins.list" || f == "builtins.set" ||
      f == "builtins.frozenset") {
    PickleValue* v = Construct(f);
    if (a.empty() || (a[0]->kind != Kind::kList && a[0]->kind != Kind::kTuple && a[0]->kind != Kind::kSet)) return v;
    if (v->kind != Kind::kDict) {
      v->items = a[0]->items;
      return v;
    }
    for (const PickleValue* pair : a[0]->items) {  // OrderedDict([(key, value), ...])
      if (pair->kind != Kind::kTuple || pair->items.size() != 2) {
        return Fail(absl::StrCat(f, " of items that are not pairs"));
      }
      v->items.insert(v->items.end(), pair->items.begin(), pair->items.end());
    }
    return v;
  }
  if (f == "collections.defaultdict") return New(Kind::kDict);
  if (absl::StartsWith(f, "torch._utils._rebuild_tensor")) return RebuildTensor(f, args);
  // Wrappers whose first argument is the value: a Parameter's data, a tensor
  // of a device without storage, TorchScript's typed lists and dicts.
  static constexpr absl::string_view kFirstArgument[] = {
      "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
      "torch._utils._rebuild_device_tensor_from_cpu_tensor", "torch.jit._pickle.restore_type_tag",
      "torch.jit._pickle.build_intlist", "torch.jit._pickle.build_tensorlist", "torch.jit._pickle.build_doublelist",
      "torch.jit._pickle.build_boollist", "torch.Size"};
  for (absl::string_view name : kFirstArgument) {
    if (f == name && !a.empty()) return a[0];
  }
  if (f == "torch._tensor._rebuild_from_type_v2" && a.size() >= 3) {  // (function, type, args, state)
    if (call_depth_ >= kMaxCallDepth) return Fail(absl::StrCat(f, " nested more than ", kMaxCallDepth, " deep"));
    ++call_depth_;
    absl::StatusOr<PickleValue*> inner = Call(*a[0], *a[2]);
    --call_depth_;
    return inner;
  }
  if (f == "torch.device" && !a.empty() && IsText(a[0])) {
    PickleValue* v = New(Kind::kString);
    v->text = a.size() > 1 && a[1]->kind == Kind::kInt ? absl::StrCat(a[0]->text, ":", a[1]->integer) : a[0]->text;
    return v;
  }
  if ((f == "_codecs.encode" || f == "builtins.bytearray" || f == "builtins.bytes") && !a.empty() && IsText(a[0])) {
    PickleValue* v = New(Kind::kBytes);
    v->text = a[0]->kind == Kind::kString ? Latin1(a[0]->text) : a[0]->text;
    return v;
  }
  if (f == "numpy.dtype" && !a.empty() && IsText(a[0])) {
    PickleValue* v = Construct(f);
    v->key = a[0]->text;  // "f8", "i4"...
    return v;
  }
  if (absl::EndsWith(f, "multiarray.scalar")) return NumpyScalar(args);
  PickleValue* v = Construct(f);
  if ((f == "copyreg._reconstructor" || absl::EndsWith(f, "multiarray._reconstruct")) && !a.empty() &&
      a[0]->kind == Kind::kGlobal) {
    v->text = a[0]->text;  // the class it makes: "numpy.ndarray"
  } else if (absl::StartsWith(f, "torch._utils._rebuild_")) {
    v->note = absl::StrCat("a tensor that ", f, " rebuilds (sparse, quantized, nested, a subclass or without storage), "
                           "which moerr does not read");
  }
  return v;
}

// _rebuild_tensor(storage, offset, sizes, strides), _v2 (..., requires_grad,
// hooks[, metadata]), _v3 (..., requires_grad, hooks, dtype[, metadata]).
absl::StatusOr<PickleValue*> TorchUnpickler::RebuildTensor(const std::string& function, const PickleValue& args) {
  const std::vector<PickleValue*>& a = args.items;
  auto ints = [](const PickleValue* v) {
    if (v->kind != Kind::kTuple && v->kind != Kind::kList) return false;
    for (const PickleValue* i : v->items) {
      if (i->kind != Kind::kInt) return false;
    }
    return true;
  };
  if (a.size() < 4 || a[0]->kind != Kind::kStorage || a[1]->kind != Kind::kInt || !ints(a[2]) || !ints(a[3]) ||
      a[2]->items.size() != a[3]->items.size()) {
    return Fail(absl::StrCat(function, " with arguments that are not (storage, offset, sizes, strides, ...)"));
  }
  if (function == "torch._utils._rebuild_tensor_v3") {
    // Only the dtypes torch.save cannot name by a storage class take this
    // path (float8, uint16 to uint64, complex32, bits): none of them is one
    // moerr stores.
    PickleValue* v = New(Kind::kObject);
    v->text = function;
    v->note = absl::StrCat("a tensor of dtype ", a.size() > 6 && a[6]->kind == Kind::kGlobal ? a[6]->text : "(unknown)",
                           ", which moerr does not store");
    return v;
  }
  PickleValue* t = New(Kind::kTensor);
  t->items = {a[0]};
  t->offset = a[1]->integer;
  for (const PickleValue* i : a[2]->items) t->sizes.push_back(i->integer);
  for (const PickleValue* i : a[3]->items) t->strides.push_back(i->integer);
  return t;
}

// BINPERSID: ("storage", storage class, key, location, numel) in the zip
// format, with a sixth member (a view, always None since torch 1.x) in the
// legacy one.
absl::StatusOr<PickleValue*> TorchUnpickler::PersistentId(const PickleValue& pid) {
  const std::vector<PickleValue*>& a = pid.items;
  if (pid.kind != Kind::kTuple || a.empty() || !IsText(a[0]) || a[0]->text != "storage") {
    PickleValue* v = New(Kind::kObject);
    v->text = "persistent id";
    v->note = pid.kind == Kind::kTuple && !a.empty() && IsText(a[0]) && a[0]->text == "module"
                  ? "a module's class (the legacy torch.save of a whole module: save its state_dict() instead)"
                  : "a persistent id that is not a storage";
    return v;
  }
  if (a.size() < 5 || a[1]->kind != Kind::kGlobal || !(IsText(a[2]) || a[2]->kind == Kind::kInt) ||
      a[4]->kind != Kind::kInt || a[4]->integer < 0) {
    return Fail("a storage's persistent id is not (\"storage\", class, key, location, numel)");
  }
  if (a.size() > 5 && a[5]->kind != Kind::kNone) return Fail("a storage view (torch before 1.0) is not read");
  // torch.FloatStorage, torch.cuda.HalfStorage, torch.UntypedStorage.
  absl::string_view type = a[1]->text;
  const bool torch_class = absl::ConsumePrefix(&type, "torch.");
  absl::ConsumePrefix(&type, "cuda.");
  if (!torch_class || !absl::ConsumeSuffix(&type, "Storage")) {
    return Fail(absl::StrCat("a storage of class ", a[1]->text, ", not a torch storage class"));
  }
  const std::string element = type == "Untyped" ? "Byte" : std::string(type);
  const std::string key = IsText(a[2]) ? a[2]->text : absl::StrCat(a[2]->integer);
  PickleValue*& storage = storages_[key];
  if (storage == nullptr) {
    storage = New(Kind::kStorage);
    storage->key = key;
    storage->text = element;
    storage->integer = a[4]->integer;
  } else if (storage->text != element) {
    return Fail(absl::StrCat("storage ", key, " is named as ", storage->text, " and as ", element));
  }
  return storage;
}

// numpy.core.multiarray.scalar(dtype, bytes): a NumPy scalar (np.float64
// in a checkpoint's metrics), read for the little-endian codes below.
PickleValue* TorchUnpickler::NumpyScalar(const PickleValue& args) {
  const std::vector<PickleValue*>& a = args.items;
  const std::string code = a.size() == 2 && a[0]->kind == Kind::kObject ? a[0]->key : "";
  const std::string bytes = a.size() == 2 && a[1]->kind == Kind::kBytes ? a[1]->text : "";
  auto integer = [&](bool is_signed) {
    uint64_t u = 0;
    for (size_t i = bytes.size(); i-- > 0;) u = (u << 8) | static_cast<uint8_t>(bytes[i]);
    if (is_signed && bytes.size() < 8 && (static_cast<uint8_t>(bytes.back()) & 0x80)) {
      u |= ~uint64_t{0} << (8 * bytes.size());  // sign-extended
    }
    return static_cast<int64_t>(u);
  };
  const size_t width = code.size() == 2 && code[1] >= '1' && code[1] <= '8' ? static_cast<size_t>(code[1] - '0') : 0;
  if (width == 0 || bytes.size() != width) return Construct("numpy scalar");
  PickleValue* v = nullptr;
  if (code == "f8" || code == "f4") {
    v = New(Kind::kFloat);
    if (width == 8) {
      std::memcpy(&v->number, bytes.data(), 8);
    } else {
      float f = 0;
      std::memcpy(&f, bytes.data(), 4);
      v->number = f;
    }
  } else if (code[0] == 'i' || (code[0] == 'u' && width < 8)) {
    v = New(Kind::kInt);
    v->integer = integer(code[0] == 'i');
  } else if (code == "b1") {
    v = New(Kind::kBool);
    v->boolean = bytes[0] != 0;
  } else {
    return Construct(absl::StrCat("numpy scalar of dtype ", code));
  }
  return v;
}

}  // namespace moerr::importers
