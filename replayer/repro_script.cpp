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

// The scripts' fixed part: the safetensors reader and the output
// bookkeeping (flattened as the recorder lists outputs: tensors and tensor
// lists in order, any other value one slot).
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


)PY";

// The first-overflow check of WriteReproScript's script.
constexpr char kOverflowCheck[] = R"PY(def floats(xs):
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

// The divergence check of WriteDivergenceScript's script: the op's output
// against its float64 run on the same inputs, as moerr diff measures the
// error an op introduces (replayer/introduced_error.h).
constexpr char kDivergenceCheck[] = R"PY(def widened(x):
    """x for the op's exact run: floating tensors and dtypes in float64 (copies: the op may write them)."""
    if isinstance(x, (tuple, list)):
        return [widened(y) for y in x]
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64, copy=True) if x.is_floating_point() else x.clone()
    if isinstance(x, torch.dtype) and x.is_floating_point:
        return torch.float64
    return x


def moved(x, device):
    """x with its tensors copied to `device`."""
    if isinstance(x, (tuple, list)):
        return [moved(y, device) for y in x]
    return x.to(device, copy=True) if isinstance(x, torch.Tensor) else x


def rel_l2(x, exact):
    """moerr's relative L2 error of x against exact (diff/tensor_metrics.h): over the elements finite in
    both; inf where one holds a NaN or an Inf the other does not, or the shapes differ."""
    x, exact = x.double().flatten(), exact.double().flatten()
    if x.shape != exact.shape or bool((torch.isnan(x) != torch.isnan(exact)).any()):
        return math.inf
    nan = torch.isnan(x) | torch.isnan(exact)
    inf = ~nan & (torch.isinf(x) | torch.isinf(exact))
    if bool((x[inf] != exact[inf]).any()):
        return math.inf
    both = ~nan & ~inf
    sq, aa = float(((x[both] - exact[both]) ** 2).sum()), float((exact[both] ** 2).sum())
    return math.sqrt(sq / aa) if aa > 0 else (math.inf if sq > 0 else 0.0)


def judge(index, name, module, op, a, kw, slot, budget, autocast, expected=None, own=None):
    """Output `slot` of the op (the recorded one, or with a device argument, this op run there on the
    recorded inputs, under the recorded autocast dtype) against the op's float64 run called with `a`, `kw`.
    `expected` names that run when it is not the recorded call (then `own` holds the recorded call's
    arguments, which the device run takes)."""
    with torch.autocast("cpu", enabled=False):
        exact = flat(op(*widened(a), **{k: widened(x) for k, x in kw.items()}))[slot]
    expected = expected or name
    device = sys.argv[1] if len(sys.argv) > 1 else None
    if device is None:
        out, what = T["recorded_output"], "the recorded output"
    else:
        on, (a, kw) = torch.device(device), own or (a, kw)
        with torch.autocast(on.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            out = flat(op(*moved(a, on), **{k: moved(x, on) for k, x in kw.items()}))[slot].cpu()
        what = f"its output on {device}"
    err = rel_l2(out, exact)
    print(f"op {index} {name} ({module}): {what} against {expected} in float64 on its recorded inputs: "
          f"relative L2 {err:.3g}, budget {budget:.3g}")
    if err > budget:
        raise AssertionError(f"op {index} {name} ({module}): {what} differs from {expected} on its recorded "
                             f"inputs by {err:.2g} (budget {budget:.2g})")
    print("within its budget: the divergence does not reproduce")


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
// "torch.ops.aten.linear.default": how a script calls `op`.
std::string TorchOp(const formats::OpEvent& op) {
  const std::string::size_type colons = op.name.find("::");
  return absl::StrCat("torch.ops.", op.name.substr(0, colons), ".", op.name.substr(colons + 2), ".",
                      op.overload.empty() ? "default" : op.overload);
}

// The dtype of the CPU autocast state `op` ran under ("torch.bfloat16"), or
// "None" when autocast was off.
absl::StatusOr<std::string> AutocastDType(const formats::OpEvent& op) {
  if (op.autocast < 0) return std::string("None");
  const auto dtype = static_cast<int64_t>(recorder::ToScalarType(static_cast<formats::DType>(op.autocast)));
  return PyEnum(c10::TypeKind::ScalarTypeType, dtype);
}

// Op `index` of a cut (recorded op `recorded`): a comment naming it, and its
// arguments as `a` (positional) and `kw` (keyword-only).
std::string ArgLines(const formats::OpEvent& op, size_t index, size_t recorded, const PyArgs& args) {
  return absl::StrCat(absl::StrFormat("\n# op %d (recorded op %d): %s%s in %s (%s)\n", index, recorded, op.name,
                                      op.overload.empty() ? "" : "." + op.overload,
                                      op.module.empty() ? "no module" : op.module, formats::PhaseName(op.phase)),
                      "a = [", absl::StrJoin(args.positional, ", "), "]\nkw = {", absl::StrJoin(args.keywords, ", "),
                      "}\n");
}

absl::StatusOr<std::string> PyOp(size_t index, size_t recorded, const formats::Trace& cut) {
  const formats::OpEvent& op = cut.ops[index];
  const c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.name, op.overload));
  MOERR_ASSIGN_OR_RETURN(const PyArgs args, PyArgsOf(op, recorded, handle ? &handle->schema().arguments() : nullptr));
  std::string out = ArgLines(op, index, recorded, args);
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
    std::string call = absl::StrCat("r = ", TorchOp(op), "(*a, **kw)\n");
    if (op.autocast >= 0) {  // the CPU autocast state it ran under
      MOERR_ASSIGN_OR_RETURN(const std::string name, AutocastDType(op));
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

// What follows a script's docstring: the fixed part, its `check`, and the
// set-up that loads the values file `values_name` beside the script.
std::string SetUp(const char* check, const std::string& values_name, int64_t threads) {
  std::string out = absl::StrCat("\"\"\"\n", kPrelude, check, "VALUES = Path(__file__).with_name(",
                                 llvm::formatv("{0}", llvm::json::Value(values_name)).str(),
                                 ")\nT = load_safetensors(VALUES)\nv = {}\ntorch.set_grad_enabled(False)\n");
  if (threads > 0) absl::StrAppend(&out, "torch.set_num_threads(", threads, ")  # as recorded\n");
  return out;
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
  return out + SetUp(kOverflowCheck, values_name, source.threads);
}

// The lines that load the cut's values no kept op makes ("v[7] = leaf(...)"),
// and in `tensors` every leaf's value the safetensors file holds.
absl::StatusOr<std::string> LeafLines(const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                                      std::vector<std::pair<std::string, formats::TensorView>>& tensors) {
  std::string out;
  for (const formats::TensorMeta& meta : cut.tensors) {
    if (meta.leaf.empty() || meta.producer >= 0) continue;  // a kept op makes it, or loads it with its op
    auto value = values.find(meta.id);
    if (value == values.end()) return absl::DataLossError(absl::StrFormat("tensor %d has no value", meta.id));
    absl::StrAppend(&out, "v[", meta.id, "] = ", PyLeaf(meta), "\n");
  }
  for (const formats::TensorMeta& meta : cut.tensors) {
    auto value = values.find(meta.id);
    if (meta.leaf.empty() || value == values.end()) continue;
    MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(value->second));
    tensors.emplace_back(meta.leaf, std::move(view));
  }
  return out;
}

// Writes `script` and, beside it, `tensors` as safetensors.
absl::Status WriteFiles(const std::string& script_path, const std::string& values_path, const std::string& script,
                        const std::vector<std::pair<std::string, formats::TensorView>>& tensors,
                        const std::string& bundle, int64_t step) {
  MOERR_RETURN_IF_ERROR(formats::WriteSafetensors(
      values_path, tensors, {{"moerr_bundle", bundle}, {"step", absl::StrCat(step)}}, /*overwrite=*/true));
  std::ofstream file(script_path, std::ios::trunc);
  file << script;
  file.close();
  if (!file) return absl::UnavailableError(absl::StrFormat("cannot write %s", script_path));
  return absl::OkStatus();
}

// The docstring of WriteDivergenceScript's script.
std::string DivergenceDocstring(const formats::OpEvent& op, const DivergenceSource& source,
                                const std::string& script_name, const std::string& values_name,
                                const std::string& assertion) {
  return absl::StrFormat(
      "\"\"\"One op of %s, step %d, reduced by `moerr reduce --against %s` (step %d): op %d %s in %s (%s),\n"
      "the first op that introduces error beyond its budget against the reference (moerr diff: an op's\n"
      "output against its float64 run on its own recorded inputs).\n\n"
      "Needs torch alone. Loads the op's recorded inputs and its recorded output %d from %s beside this\n"
      "file, runs the op in float64 on those inputs through torch.ops, and compares: while the recorded\n"
      "output is wrong it raises\n    AssertionError: %s\n"
      "The budget is %gx the error of this op's run here in the recorded dtypes (%s). `python %s DEVICE`\n"
      "judges the op's output on DEVICE (cuda, npu, cpu) instead: a kernel team reruns it there.\n",
      source.bundle, source.step, source.reference, source.reference_step, source.op, op.name,
      op.module.empty() ? "no module" : op.module, formats::PhaseName(op.phase), source.slot, values_name, assertion,
      source.budget_multiple, source.dtype, script_name);
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
  MOERR_ASSIGN_OR_RETURN(const std::string leaves, LeafLines(cut, values, tensors));
  absl::StrAppend(&script, "\n# The values that feed the kept ops (cut free from the step).\n", leaves);
  for (size_t i = 0; i < cut.ops.size(); ++i) {
    MOERR_ASSIGN_OR_RETURN(std::string lines, PyOp(i, source.kept[i], cut));
    absl::StrAppend(&script, lines);
  }
  absl::StrAppend(&script, "\nprint(\"no op made Inf or NaN from finite inputs: the failure does not reproduce\")\n");
  MOERR_RETURN_IF_ERROR(WriteFiles(script_path, values_path, script, tensors, source.bundle, source.step));
  return assertion;
}

absl::StatusOr<std::string> WriteDivergenceScript(const std::string& script_path, const std::string& values_path,
                                                  const formats::Trace& cut, const formats::OpEvent& called,
                                                  const std::map<uint64_t, at::Tensor>& values,
                                                  const DivergenceSource& source) {
  MOERR_CHECK(cut.ops.size() == 1 && source.slot < cut.ops[0].outputs.size());
  const formats::OpEvent& op = cut.ops[0];
  const formats::TensorMeta* judged = cut.Find(op.outputs[source.slot]);
  MOERR_CHECK(judged != nullptr && !judged->leaf.empty() && values.count(judged->id));
  const std::string module = op.module.empty() ? "no module" : op.module;
  const c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.name, op.overload));
  if (!handle || handle->schema().returns().empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "op %d %s %s: the repro runs an op through torch.ops and compares what it returns", source.op, op.name,
        handle ? "returns nothing" : "is not an op of this LibTorch"));
  }
  const std::string expected =
      source.call_difference.empty()
          ? op.name
          : absl::StrFormat("%s called as the reference calls it (%s)", op.name, source.call_difference);
  const std::string assertion =
      absl::StrFormat("op %d %s (%s): the recorded output differs from %s on its recorded inputs by %.2g (budget %.2g)",
                      source.op, op.name, module, expected, source.introduced, source.budget);
  const std::string values_name = std::filesystem::path(values_path).filename().string();
  std::string script = DivergenceDocstring(op, source, std::filesystem::path(script_path).filename().string(),
                                           values_name, assertion);
  absl::StrAppend(&script, SetUp(kDivergenceCheck, values_name, source.threads));
  std::vector<std::pair<std::string, formats::TensorView>> tensors;
  MOERR_ASSIGN_OR_RETURN(const std::string leaves, LeafLines(cut, values, tensors));
  for (auto& [name, view] : tensors) {
    if (name == judged->leaf) name = "recorded_output";  // the value judged, by the name the script reads
  }
  MOERR_ASSIGN_OR_RETURN(const PyArgs args, PyArgsOf(op, source.op, &handle->schema().arguments()));
  MOERR_ASSIGN_OR_RETURN(const std::string autocast, AutocastDType(op));
  std::string call = ArgLines(op, 0, source.op, args), extra;
  if (!source.call_difference.empty()) {  // the fp64 run calls it as the reference does
    MOERR_ASSIGN_OR_RETURN(const PyArgs as_reference, PyArgsOf(called, source.op, &handle->schema().arguments()));
    absl::StrAppend(&call, "own = (a, kw)\n# As the reference calls it (", source.call_difference, "):\n",
                    "a = [", absl::StrJoin(as_reference.positional, ", "), "]\nkw = {",
                    absl::StrJoin(as_reference.keywords, ", "), "}\n");
    extra = absl::StrCat(", ", llvm::formatv("{0}", llvm::json::Value(expected)).str(), ", own");
  }
  absl::StrAppend(&script, "\n# The op's recorded inputs.\n", leaves, call,
                  absl::StrFormat("# Output %d, judged: relative L2 against the float64 run, at most the budget, "
                                  "%gx this machine's %s rounding of it (moerr diff).\n",
                                  source.slot, source.budget_multiple, source.dtype),
                  absl::StrFormat("judge(%d, \"%s\", %s, %s, a, kw, %d, %s, %s%s)\n", source.op, op.name,
                                  llvm::formatv("{0}", llvm::json::Value(module)).str(), TorchOp(op), source.slot,
                                  PyFloat(source.budget), autocast, extra));
  MOERR_RETURN_IF_ERROR(WriteFiles(script_path, values_path, script, tensors, source.bundle, source.step));
  return assertion;
}

}  // namespace moerr::replayer
