#include "replayer/repro_script.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/collective_op.h"
#include "formats/safetensors.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/py_args.h"
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

// The inputs of an op's float64 run and of its run on another device, for
// the divergence and vendor-op scripts.
constexpr char kWidening[] = R"PY(def widened(x, dtypes=True):
    """x for an op's exact run: floating tensors (and, with `dtypes`, dtype arguments) in float64; copies,
    as the op may write them."""
    if isinstance(x, (tuple, list)):
        return [widened(y, dtypes) for y in x]
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64, copy=True) if x.is_floating_point() else x.clone()
    if dtypes and isinstance(x, torch.dtype) and x.is_floating_point:
        return torch.float64
    return x


def moved(x, device):
    """x with its tensors copied to `device`."""
    if isinstance(x, (tuple, list)):
        return [moved(y, device) for y in x]
    return x.to(device, copy=True) if isinstance(x, torch.Tensor) else x


)PY";

// The divergence check of WriteDivergenceScript's script: the op's output
// against its float64 run on the same inputs, as moerr diff measures the
// error an op introduces (replayer/introduced_error.h).
constexpr char kDivergenceCheck[] = R"PY(def rel_l2(x, exact):
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


// The vendor-op check of WriteVendorScript's script: a recorded output of
// an op this torch may lack against the op's reference (a TorchScript file
// beside the script) in float64, in ULPs of its dtype, as moerr bisect and
// lint judge it (replayer/reference_run.h, JudgeAgainstReference).
constexpr char kVendorCheck[] = R"PY(def ulp_index(x, dtype):
    """Each element's place on the number line of `dtype`, in its ULPs (diff/tensor_metrics.cpp): bf16
    and fp16 are fp32 with 7 and 10 mantissa bits."""
    if dtype == torch.float64:
        bits = x.double().view(torch.int64)
        return torch.where(bits < 0, torch.iinfo(torch.int64).min - bits, bits)
    bits = x.double().float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bits = torch.where(bits >= 0x80000000, 0x80000000 - (bits & 0x7FFFFFFF), bits + 0x80000000)
    return bits >> {torch.bfloat16: 16, torch.float16: 13}.get(dtype, 0)


def distance(x, exact, dtype):
    """The largest distance in ULPs of `dtype` between x and exact over the elements finite in both, and
    how many elements hold a NaN or an Inf the other does not."""
    x, exact = x.double().flatten(), exact.double().flatten()
    if x.shape != exact.shape:
        raise SystemExit(f"shapes differ: {tuple(x.shape)} and {tuple(exact.shape)}")
    nan = torch.isnan(x) | torch.isnan(exact)
    inf = ~nan & (torch.isinf(x) | torch.isinf(exact))
    mismatched = int((torch.isnan(x) != torch.isnan(exact)).sum()) + int((inf & (x != exact)).sum())
    both = ~nan & ~inf & (x != exact)
    ulps = (ulp_index(x[both], dtype) - ulp_index(exact[both], dtype)).abs()
    return (int(ulps.max()) if ulps.numel() else 0), mismatched


def reference_inputs(a, kw):
    """The reference's arguments, as moerr passes them (replayer/op_references.h): every argument of the op
    when forward takes that many, else its tensors alone."""
    args = a + list(kw.values())
    params = REFERENCE.forward.schema.arguments[1:]
    required = len(params)
    while required > 0 and params[required - 1].has_default_value():
        required -= 1
    if required <= len(args) <= len(params):
        return args
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    if len(tensors) != len(params):
        raise SystemExit(f"the reference takes {len(params)} arguments; the op has {len(args)}")
    return tensors


def judge(index, name, overload, module, a, kw, slot, dtype, allowance):
    """Output `slot` of the op (as recorded, or with a device argument, the op itself run there on the
    recorded inputs) against the reference's float64 run: suspect beyond twice the larger of `allowance`
    and the reference's own distance from that run in the recorded dtypes, or with a NaN or Inf the
    reference's run has not."""
    inputs = reference_inputs(a, kw)
    with torch.autocast("cpu", enabled=False):
        exact = flat(REFERENCE(*widened(inputs, dtypes=False)))[slot]
        mine = flat(REFERENCE(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]))[slot]
    device = sys.argv[1] if len(sys.argv) > 1 else None
    if device is None:
        out, what = T["recorded_output"], "the recorded output"
    else:
        if device.startswith("npu"):
            import torch_npu  # noqa: F401  registers the npu ops and device
        namespace, _, op_name = name.partition("::")
        if not hasattr(getattr(torch.ops, namespace), op_name):
            raise SystemExit(f"{name} is not an op of this torch: run it where its library is loaded")
        op, on = getattr(getattr(getattr(torch.ops, namespace), op_name), overload), torch.device(device)
        out = flat(op(*moved(a, on), **{k: moved(x, on) for k, x in kw.items()}))[slot].cpu()
        what = f"its output on {device}"
    recorded_ulps, recorded_bad = distance(out, exact, dtype)
    own_ulps, own_bad = distance(mine, exact, dtype)
    allowed = 2 * max(own_ulps, allowance)
    ulp = str(dtype).replace("torch.", "")
    print(f"op {index} {name} ({module}): {what} {slot} is {recorded_ulps} ULPs of {ulp} from its reference in "
          f"float64 ({recorded_bad} NaN or Inf it has not); the reference in {ulp} is {own_ulps} (allowed {allowed})")
    if recorded_ulps > allowed or recorded_bad > own_bad:
        raise AssertionError(f"op {index} {name} ({module}): {what} {slot} is {recorded_ulps} ULPs of {ulp} from "
                             f"its reference in float64 (allowed {allowed})")
    print("within what its reference allows: the verdict does not reproduce")


)PY";

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
std::string SetUp(const std::string& check, const std::string& values_name, int64_t threads) {
  std::string out = absl::StrCat("\"\"\"\n", kPrelude, check, "VALUES = Path(__file__).with_name(",
                                 PyString(values_name),
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

// The Python name of a floating dtype ("float32"), as the vendor script
// prints it.
std::string PyDTypeName(formats::DType dtype) {
  switch (dtype) {
    case formats::DType::kF64: return "float64";
    case formats::DType::kF16: return "float16";
    case formats::DType::kBF16: return "bfloat16";
    default: return "float32";
  }
}

// The docstring of WriteVendorScript's script.
std::string VendorDocstring(const formats::OpEvent& op, const VendorSource& source, const std::string& script_name,
                            const std::string& values_name, const std::string& assertion) {
  return absl::StrFormat(
      "\"\"\"One op of %s, step %d, reduced by `moerr reduce`:\n    op %d %s in %s (%s),\n"
      "a vendor op whose recorded output is further from its reference than the reference's own\n"
      "rounding allows (the vendor-op verdict of moerr bisect and lint).\n\n"
      "Needs torch alone. Beside this file: the op's recorded inputs and its recorded output %d\n"
      "(%s), and the op's reference as TorchScript (%s, a copy of\n%s).\n"
      "It runs the reference on those inputs in float64 and in the recorded dtypes, and measures\n"
      "each output against the float64 run in ULPs of %s. The recorded output may be at most twice\n"
      "the larger of %d ULPs and the reference's own distance; while it is not, this raises\n"
      "    AssertionError: %s\n"
      "`python %s DEVICE` judges the op itself instead, run on DEVICE (npu, cuda) where its\n"
      "library is loaded: a kernel team reruns it there.\n",
      source.bundle, source.step, source.op, op.name, op.module.empty() ? "no module" : op.module,
      formats::PhaseName(op.phase), source.slot, values_name, source.reference_name, source.reference_origin,
      PyDTypeName(source.dtype), source.allowance, assertion, script_name);
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
  absl::StrAppend(&script, SetUp(absl::StrCat(kWidening, kDivergenceCheck), values_name, source.threads));
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
    extra = absl::StrCat(", ", PyString(expected), ", own");
  }
  absl::StrAppend(&script, "\n# The op's recorded inputs.\n", leaves, call,
                  absl::StrFormat("# Output %d, judged: relative L2 against the float64 run, at most the budget, "
                                  "%gx this machine's %s rounding of it (moerr diff).\n",
                                  source.slot, source.budget_multiple, source.dtype),
                  absl::StrFormat("judge(%d, \"%s\", %s, %s, a, kw, %d, %s, %s%s)\n", source.op, op.name,
                                  PyString(module), TorchOp(op), source.slot,
                                  PyFloat(source.budget), autocast, extra));
  MOERR_RETURN_IF_ERROR(WriteFiles(script_path, values_path, script, tensors, source.bundle, source.step));
  return assertion;
}

absl::StatusOr<std::string> WriteVendorScript(const std::string& script_path, const std::string& values_path,
                                              const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                                              const VendorSource& source) {
  MOERR_CHECK(cut.ops.size() == 1 && source.slot < cut.ops[0].outputs.size());
  const formats::OpEvent& op = cut.ops[0];
  const formats::TensorMeta* judged = cut.Find(op.outputs[source.slot]);
  MOERR_CHECK(judged != nullptr && !judged->leaf.empty() && values.count(judged->id));
  const std::string module = op.module.empty() ? "no module" : op.module;
  const std::string assertion = absl::StrFormat(
      "op %d %s (%s): the recorded output %d is %d ULPs of %s from its reference in float64 (allowed %d)", source.op,
      op.name, module, source.slot, source.recorded_ulps, PyDTypeName(source.dtype), source.allowed_ulps);
  const std::string values_name = std::filesystem::path(values_path).filename().string();
  std::string script = VendorDocstring(op, source, std::filesystem::path(script_path).filename().string(),
                                       values_name, assertion);
  absl::StrAppend(&script, SetUp(absl::StrCat(kWidening, kVendorCheck), values_name, source.threads),
                  "REFERENCE = torch.jit.load(str(Path(__file__).with_name(", PyString(source.reference_name),
                  ")))\n");
  std::vector<std::pair<std::string, formats::TensorView>> tensors;
  MOERR_ASSIGN_OR_RETURN(const std::string leaves, LeafLines(cut, values, tensors));
  for (auto& [name, view] : tensors) {
    if (name == judged->leaf) name = "recorded_output";  // the value judged, by the name the script reads
  }
  // The op's schema, where this LibTorch has it (a vendor op usually has
  // not: every argument is then positional, as recorded).
  const c10::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.name, op.overload));
  MOERR_ASSIGN_OR_RETURN(const PyArgs args, PyArgsOf(op, source.op, handle ? &handle->schema().arguments() : nullptr));
  absl::StrAppend(&script, "\n# The op's recorded inputs.\n", leaves, ArgLines(op, 0, source.op, args),
                  absl::StrFormat("# Output %d, judged against the reference's float64 run (moerr bisect, lint).\n",
                                  source.slot),
                  absl::StrFormat("judge(%d, %s, %s, %s, a, kw, %d, torch.%s, %d)\n", source.op, PyString(op.name),
                                  PyString(op.overload.empty() ? "default" : op.overload), PyString(module),
                                  source.slot, PyDTypeName(source.dtype), source.allowance));
  MOERR_RETURN_IF_ERROR(WriteFiles(script_path, values_path, script, tensors, source.bundle, source.step));
  return assertion;
}

}  // namespace moerr::replayer
