#include "replayer/py_args.h"

#include <ATen/ops/empty_strided.h>

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/status.h"

namespace moerr::replayer {

using formats::OpArg;

std::string PyString(const std::string& s) { return llvm::formatv("{0}", llvm::json::Value(s)).str(); }

std::string PyFloat(double f) {
  if (std::isnan(f)) return "float('nan')";
  if (std::isinf(f)) return f > 0 ? "float('inf')" : "float('-inf')";
  std::string s = absl::StrFormat("%.17g", f);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {

std::string PyBool(int64_t b) { return b != 0 ? "True" : "False"; }

// An int that travels as a ScalarType, Layout or MemoryFormat (the schema's
// real type says which), as the Python object torch.ops takes.
absl::StatusOr<std::string> PyEnum(c10::TypeKind kind, int64_t value) {
  static const std::map<int64_t, const char*> kScalarTypes = {
      {static_cast<int64_t>(at::kByte), "uint8"},     {static_cast<int64_t>(at::kChar), "int8"},
      {static_cast<int64_t>(at::kShort), "int16"},    {static_cast<int64_t>(at::kInt), "int32"},
      {static_cast<int64_t>(at::kLong), "int64"},     {static_cast<int64_t>(at::kHalf), "float16"},
      {static_cast<int64_t>(at::kFloat), "float32"},  {static_cast<int64_t>(at::kDouble), "float64"},
      {static_cast<int64_t>(at::kBool), "bool"},      {static_cast<int64_t>(at::kBFloat16), "bfloat16"}};
  static const std::map<int64_t, const char*> kLayouts = {{0, "strided"}, {1, "sparse_coo"}};
  static const std::map<int64_t, const char*> kMemoryFormats = {
      {0, "contiguous_format"}, {1, "preserve_format"}, {2, "channels_last"}, {3, "channels_last_3d"}};
  const std::map<int64_t, const char*>& table = kind == c10::TypeKind::ScalarTypeType ? kScalarTypes
                                                 : kind == c10::TypeKind::LayoutType   ? kLayouts
                                                                                       : kMemoryFormats;
  auto it = table.find(value);
  if (it == table.end()) return absl::UnimplementedError(absl::StrFormat("enum value %d has no Python name here", value));
  return absl::StrCat("torch.", it->second);
}

// The kind of enum an int argument travels as, or NoneType for a plain int.
c10::TypeKind EnumKind(const c10::Argument* arg) {
  if (arg == nullptr) return c10::TypeKind::NoneType;
  c10::TypePtr type = arg->real_type();  // type() says int: these travel as ints
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  const c10::TypeKind kind = type->kind();
  const bool is_enum = kind == c10::TypeKind::ScalarTypeType || kind == c10::TypeKind::LayoutType ||
                       kind == c10::TypeKind::MemoryFormatType;
  return is_enum ? kind : c10::TypeKind::NoneType;
}

std::string PyTensor(int64_t id) { return id < 0 ? "None" : absl::StrCat("v[", id, "]"); }

// Argument `a` as a Python expression for torch.ops.
absl::StatusOr<std::string> PyArg(const OpArg& a, const c10::Argument* schema_arg) {
  switch (a.kind) {
    case OpArg::Kind::kNone: return std::string("None");
    case OpArg::Kind::kTensor: return PyTensor(a.i);
    case OpArg::Kind::kTensors:
    case OpArg::Kind::kOptionalTensors: {
      std::vector<std::string> items;
      for (int64_t id : a.ints) items.push_back(PyTensor(id));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    case OpArg::Kind::kInt: {
      const c10::TypeKind kind = EnumKind(schema_arg);
      return kind == c10::TypeKind::NoneType ? absl::StrCat(a.i) : PyEnum(kind, a.i);
    }
    case OpArg::Kind::kWrappedInt: return absl::StrCat(a.i);
    case OpArg::Kind::kFloat:
    case OpArg::Kind::kWrappedFloat: return PyFloat(a.f);
    case OpArg::Kind::kBool:
    case OpArg::Kind::kWrappedBool: return PyBool(a.i);
    case OpArg::Kind::kText: return PyString(a.text);
    case OpArg::Kind::kInts: return absl::StrCat("[", absl::StrJoin(a.ints, ", "), "]");
    case OpArg::Kind::kFloats: {
      std::vector<std::string> items;
      for (double f : a.floats) items.push_back(PyFloat(f));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    case OpArg::Kind::kBools: {
      std::vector<std::string> items;
      for (int64_t b : a.ints) items.push_back(PyBool(b));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    case OpArg::Kind::kDevice:
      return absl::StrCat("torch.device(", PyString(a.text), ")");
    case OpArg::Kind::kUnsupported: break;
  }
  return absl::UnimplementedError(absl::StrFormat("an argument of kind %s has no Python form", a.text));
}

}  // namespace

std::string PyLeaf(const formats::TensorMeta& meta) {
  const std::string name = PyString(meta.leaf);
  // On the meta device: the layout alone, no memory.
  const at::Tensor probe = at::empty_strided(meta.shape, meta.strides, at::TensorOptions().device(at::kMeta));
  if (probe.is_contiguous() || !probe.is_non_overlapping_and_dense()) return absl::StrCat("leaf(", name, ")");
  return absl::StrCat("leaf(", name, ", (", absl::StrJoin(meta.strides, ", "), meta.strides.size() == 1 ? ",))" : "))");
}


absl::StatusOr<PyArgs> PyArgsOf(const formats::OpEvent& op, size_t recorded,
                                const std::vector<c10::Argument>* schema) {
  PyArgs out;
  for (size_t i = 0; i < op.args.size(); ++i) {
    const c10::Argument* arg = schema != nullptr && i < schema->size() ? &(*schema)[i] : nullptr;
    absl::StatusOr<std::string> expr = PyArg(op.args[i], arg);
    if (!expr.ok()) return Annotate(expr.status(), absl::StrFormat("op %d %s, argument %d", recorded, op.name, i));
    if (arg != nullptr && arg->kwarg_only()) {
      out.keywords.push_back(absl::StrCat(PyString(arg->name()), ": ", *expr));
    } else {
      out.positional.push_back(*expr);
    }
    if (arg != nullptr && arg->alias_info() != nullptr && arg->alias_info()->isWrite()) out.written.push_back(*expr);
  }
  return out;
}

std::string TorchOp(const formats::OpEvent& op) {
  const std::string::size_type colons = op.name.find("::");
  return absl::StrCat("torch.ops.", op.name.substr(0, colons), ".", op.name.substr(colons + 2), ".",
                      op.overload.empty() ? "default" : op.overload);
}

absl::StatusOr<std::string> AutocastDType(const formats::OpEvent& op) {
  if (op.autocast < 0) return std::string("None");
  const auto dtype = static_cast<int64_t>(recorder::ToScalarType(static_cast<formats::DType>(op.autocast)));
  return PyEnum(c10::TypeKind::ScalarTypeType, dtype);
}

std::string ArgLines(const formats::OpEvent& op, size_t index, size_t recorded, const PyArgs& args) {
  return absl::StrCat(absl::StrFormat("\n# op %d (recorded op %d): %s%s in %s (%s)\n", index, recorded, op.name,
                                      op.overload.empty() ? "" : "." + op.overload,
                                      op.module.empty() ? "no module" : op.module, formats::PhaseName(op.phase)),
                      "a = [", absl::StrJoin(args.positional, ", "), "]\nkw = {", absl::StrJoin(args.keywords, ", "),
                      "}\n");
}

}  // namespace moerr::replayer
