#include "replayer/repro_script.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/collective_op.h"
#include "formats/safetensors.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

using formats::OpArg;

// The script's fixed part: the safetensors reader, the output bookkeeping
// (flattened as the recorder lists outputs: tensors and tensor lists in
// order, any other value one slot) and the first-overflow check.
constexpr char kPrelude[] = R"PY(import json
import math
import struct
import sys
from pathlib import Path

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def load_safetensors(path):
    data = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = _DTYPES[entry["dtype"]]
        raw = bytearray(data[8 + size + begin:8 + size + end])
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(entry["shape"])
    return out


def leaf(name, strides=None):
    """A recorded value, with the strides the op saw when they were dense."""
    t = T[name]
    if strides is None:
        return t.clone()
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype)
    out.copy_(t)
    return out


def flat(result):
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    out = []
    for x in items:
        if isinstance(x, (tuple, list)):
            out.extend(x)
        else:
            out.append(x)
    return out


def keep(outputs, ids):
    for i, x in zip(ids, outputs):
        if i:
            v[i] = x


def floats(xs):
    for x in xs:
        if isinstance(x, (tuple, list)):
            yield from floats(x)
        elif isinstance(x, torch.Tensor) and x.is_floating_point():
            yield x
        elif isinstance(x, float):
            yield torch.tensor(x, dtype=torch.float64)


def check(index, name, inputs, outputs):
    """Fails like moerr's first overflow: Inf or NaN out of finite inputs."""
    outs = list(floats(outputs))
    finite = [x[torch.isfinite(x)] for x in outs]
    top = max((float(x.abs().max()) for x in finite if x.numel()), default=0.0)
    print(f"op {index} {name}: output abs-max {top:.6g}")
    if not all(bool(torch.isfinite(x).all()) for x in floats(inputs)):
        return
    bad = [x for x in outs if not bool(torch.isfinite(x).all())]
    if bad:
        kinds = [k for k, f in (("Inf", torch.isinf), ("NaN", torch.isnan)) if any(bool(f(x).any()) for x in bad)]
        raise AssertionError(f"op {index} {name} produces {' and '.join(kinds)} from finite inputs")


)PY";

// A Python float literal that stays a float ("1.0", not "1": a Scalar's type
// decides type promotion).
std::string PyFloat(double f) {
  if (std::isnan(f)) return "float('nan')";
  if (std::isinf(f)) return f > 0 ? "float('inf')" : "float('-inf')";
  std::string s = absl::StrFormat("%.17g", f);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

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
    case OpArg::Kind::kText: return llvm::formatv("{0}", llvm::json::Value(a.text)).str();
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
      return absl::StrCat("torch.device(", llvm::formatv("{0}", llvm::json::Value(a.text)).str(), ")");
    case OpArg::Kind::kUnsupported: break;
  }
  return absl::UnimplementedError(absl::StrFormat("an argument of kind %s has no Python form", a.text));
}

// `leaf("NAME")` of a cut-free value, with its recorded strides when the op
// saw a dense non-contiguous layout (the replay restores those too).
std::string PyLeaf(const formats::TensorMeta& meta) {
  const std::string name = llvm::formatv("{0}", llvm::json::Value(meta.leaf)).str();
  // On the meta device: the layout alone, no memory.
  const at::Tensor probe = at::empty_strided(meta.shape, meta.strides, at::TensorOptions().device(at::kMeta));
  if (probe.is_contiguous() || !probe.is_non_overlapping_and_dense()) return absl::StrCat("leaf(", name, ")");
  return absl::StrCat("leaf(", name, ", (", absl::StrJoin(meta.strides, ", "), meta.strides.size() == 1 ? ",))" : "))");
}

// An op's arguments as Python expressions: positional, keyword-only (as
// `"name": expr` entries of a dict) and those the op writes in place.
struct PyArgs {
  std::vector<std::string> positional, keywords, written;
};

// `schema` may be null (an op this LibTorch lacks): ints stay ints.
absl::StatusOr<PyArgs> PyArgsOf(const formats::OpEvent& op, size_t recorded,
                                const std::vector<c10::Argument>* schema) {
  PyArgs out;
  for (size_t i = 0; i < op.args.size(); ++i) {
    const c10::Argument* arg = schema != nullptr && i < schema->size() ? &(*schema)[i] : nullptr;
    absl::StatusOr<std::string> expr = PyArg(op.args[i], arg);
    if (!expr.ok()) return Annotate(expr.status(), absl::StrFormat("op %d %s, argument %d", recorded, op.name, i));
    if (arg != nullptr && arg->kwarg_only()) {
      out.keywords.push_back(absl::StrCat(llvm::formatv("{0}", llvm::json::Value(arg->name())).str(), ": ", *expr));
    } else {
      out.positional.push_back(*expr);
    }
    if (arg != nullptr && arg->alias_info() != nullptr && arg->alias_info()->isWrite()) out.written.push_back(*expr);
  }
  return out;
}

// The lines of op `index` of the cut: its arguments, a call through
// torch.ops (or its outputs loaded: a random, foreign or collective op's,
// which the replay takes from the record), and the check.
absl::StatusOr<std::string> PyOp(size_t index, size_t recorded, const formats::Trace& cut) {
  const formats::OpEvent& op = cut.ops[index];
  std::string out = absl::StrFormat("\n# op %d (recorded op %d): %s%s in %s (%s)\n", index, recorded, op.name,
                                    op.overload.empty() ? "" : "." + op.overload,
                                    op.module.empty() ? "no module" : op.module, formats::PhaseName(op.phase));
  const c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.name, op.overload));
  MOERR_ASSIGN_OR_RETURN(const PyArgs args, PyArgsOf(op, recorded, handle ? &handle->schema().arguments() : nullptr));
  absl::StrAppend(&out, "a = [", absl::StrJoin(args.positional, ", "), "]\nkw = {", absl::StrJoin(args.keywords, ", "),
                  "}\n");
  const bool from_record = !op.outputs.empty() && std::all_of(op.outputs.begin(), op.outputs.end(), [&](uint64_t id) {
    const formats::TensorMeta* meta = cut.Find(id);
    return id == 0 || (meta != nullptr && !meta->leaf.empty());
  });
  if (from_record) {
    std::vector<std::string> outs;
    for (uint64_t id : op.outputs) {
      if (id != 0) absl::StrAppend(&out, "v[", id, "] = ", PyLeaf(*cut.Find(id)), "  # from the record\n");
      outs.push_back(id != 0 ? absl::StrCat("v[", id, "]") : "None");
    }
    absl::StrAppend(&out, "outs = [", absl::StrJoin(outs, ", "), "]\n");
  } else {
    if (!handle || formats::IsCollective(op)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "op %d %s cannot run from torch.ops and the cut holds none of its outputs", recorded, op.name));
    }
    const std::string::size_type colons = op.name.find("::");
    std::string call = absl::StrCat("r = torch.ops.", op.name.substr(0, colons), ".", op.name.substr(colons + 2), ".",
                                    op.overload.empty() ? "default" : op.overload, "(*a, **kw)\n");
    if (op.autocast >= 0) {  // the CPU autocast state it ran under
      const auto dtype = static_cast<int64_t>(recorder::ToScalarType(static_cast<formats::DType>(op.autocast)));
      MOERR_ASSIGN_OR_RETURN(const std::string name, PyEnum(c10::TypeKind::ScalarTypeType, dtype));
      call = absl::StrCat("with torch.autocast(\"cpu\", dtype=", name, "):\n    ", call);
    }
    // An op that returns nothing (in-place _foreach_*_) has the tensors it
    // writes as its outputs, as the recorder lists them.
    const bool returns = !handle->schema().returns().empty();
    absl::StrAppend(&out, call, "outs = ",
                    returns ? "flat(r)" : absl::StrCat("[", absl::StrJoin(args.written, ", "), "]"), "\n");
    absl::StrAppend(&out, "keep(outs, [", absl::StrJoin(op.outputs, ", "), "])\n");
  }
  absl::StrAppend(&out, "check(", index, ", \"", op.name, "\", a + list(kw.values()), outs)\n");
  return out;
}

// "Inf", "NaN" or "Inf and NaN": what the last op's recorded outputs hold.
std::string NonFinite(const formats::Trace& cut) {
  bool inf = false, nan = false;
  for (uint64_t id : cut.ops.back().outputs) {
    if (const formats::TensorMeta* meta = cut.Find(id)) {
      inf = inf || meta->fingerprint.pos_inf + meta->fingerprint.neg_inf > 0;
      nan = nan || meta->fingerprint.nan > 0;
    }
  }
  return inf && nan ? "Inf and NaN" : nan ? "NaN" : "Inf";
}

// The docstring and set-up: where the cut came from, what it asserts.
std::string Header(const formats::Trace& cut, const ReproSource& source, const std::string& values_name,
                   const std::string& assertion) {
  std::string out = absl::StrFormat(
      "\"\"\"A failing op sequence reduced by `moerr reduce` from %s, step %d: %d of its %d ops.\n\n"
      "Needs torch alone. Loads the values that feed the kept ops from %s beside this file, calls the\n"
      "ops in recorded order through torch.ops, and after each checks for Inf or NaN made from finite\n"
      "inputs. While the failure reproduces it raises\n    AssertionError: %s\n",
      source.bundle, source.step, cut.ops.size(), source.ops, values_name, assertion);
  if (source.cause) {
    const formats::OpEvent& cause = cut.ops[*source.cause];
    absl::StrAppend(&out, absl::StrFormat("The cause (moerr bisect): op %d %s in %s, whose output exploded.\n",
                                          *source.cause, cause.name, cause.module));
  }
  absl::StrAppend(&out, "\"\"\"\n", kPrelude, "VALUES = Path(__file__).with_name(",
                  llvm::formatv("{0}", llvm::json::Value(values_name)).str(), ")\nT = load_safetensors(VALUES)\n",
                  "v = {}\ntorch.set_grad_enabled(False)\n");
  if (source.threads > 0) absl::StrAppend(&out, "torch.set_num_threads(", source.threads, ")  # as recorded\n");
  return out;
}

}  // namespace

absl::StatusOr<std::string> WriteReproScript(const std::string& script_path, const std::string& values_path,
                                             const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                                             const ReproSource& source) {
  MOERR_CHECK(!cut.ops.empty() && source.kept.size() == cut.ops.size());
  const std::string assertion =
      absl::StrFormat("op %d %s produces %s from finite inputs", cut.ops.size() - 1, cut.ops.back().name, NonFinite(cut));
  const std::string values_name = std::filesystem::path(values_path).filename().string();
  std::string script = Header(cut, source, values_name, assertion);
  std::vector<std::pair<std::string, formats::TensorView>> tensors;
  absl::StrAppend(&script, "\n# The values that feed the kept ops (cut free from the step).\n");
  for (const formats::TensorMeta& meta : cut.tensors) {
    if (meta.leaf.empty() || meta.producer >= 0) continue;  // a kept op makes it, or loads it with its op
    auto value = values.find(meta.id);
    if (value == values.end()) return absl::DataLossError(absl::StrFormat("tensor %d has no value", meta.id));
    absl::StrAppend(&script, "v[", meta.id, "] = ", PyLeaf(meta), "\n");
  }
  for (const formats::TensorMeta& meta : cut.tensors) {
    auto value = values.find(meta.id);
    if (meta.leaf.empty() || value == values.end()) continue;
    MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(value->second));
    tensors.emplace_back(meta.leaf, std::move(view));
  }
  for (size_t i = 0; i < cut.ops.size(); ++i) {
    MOERR_ASSIGN_OR_RETURN(std::string lines, PyOp(i, source.kept[i], cut));
    absl::StrAppend(&script, lines);
  }
  absl::StrAppend(&script, "\nprint(\"no op made Inf or NaN from finite inputs: the failure does not reproduce\")\n");
  MOERR_RETURN_IF_ERROR(formats::WriteSafetensors(
      values_path, tensors, {{"moerr_bundle", source.bundle}, {"step", absl::StrCat(source.step)}}, /*overwrite=*/true));
  std::ofstream file(script_path, std::ios::trunc);
  file << script;
  file.close();
  if (!file) return absl::UnavailableError(absl::StrFormat("cannot write %s", script_path));
  return assertion;
}

}  // namespace moerr::replayer
