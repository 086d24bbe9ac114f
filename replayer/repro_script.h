// The standalone repros of an op-level reduce: for a first overflow
// (op_reduce.h, WriteReproScript), for a divergence from a reference
// recording (divergence_reduce.h, WriteDivergenceScript) and for a vendor
// op's verdict (vendor_reduce.h, WriteVendorScript). Each is a Python script
// that needs torch alone and loads the cut's leaves from a safetensors file
// beside it (its own reader, no `safetensors` package). The overflow's calls
// the kept ops in recorded order through
// `torch.ops.<namespace>.<op>.<overload>` (outputs of random and foreign
// ops, which the replay takes from the record, are loaded too), each under
// the CPU autocast state it was recorded with, with grad mode off and the
// recorded thread count, and after each op checks what
// analysis::FindFirstOverflow checks: an op whose floating inputs (tensors and
// scalars) are finite and one of whose floating outputs is not raises
// AssertionError("op 3 aten::linear produces Inf from finite inputs"). It
// exits 0 when no op does.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/dtype.h"
#include "formats/trace.h"

namespace moerr::replayer {

// Where the cut came from, for the script's docstring.
struct ReproSource {
  std::string bundle;           // the recording's path
  int64_t step = 0;
  size_t ops = 0;               // ops in the recorded step
  std::vector<size_t> kept;     // the recorded op index of each op of the cut
  int64_t threads = 0;          // intra-op threads it was recorded with; 0: unknown (left as it is)
  std::optional<size_t> cause;  // position in the cut of the op bisect names as the cause
};

// Writes the script to `script_path` and the values of `cut`'s leaves
// (`values`, by tensor id) to `values_path`, which the script finds by its
// file name beside itself. Returns the assertion the script raises while
// the last op's recorded failure reproduces. LibTorch may throw (schema
// lookups): callers catch at their boundary.
absl::StatusOr<std::string> WriteReproScript(const std::string& script_path, const std::string& values_path,
                                             const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                                             const ReproSource& source);

// The op a divergence reduce keeps (divergence_reduce.h), for its script.
struct DivergenceSource {
  std::string bundle, reference;  // the recordings' paths: the one reduced, the one it is diffed against
  int64_t step = 0, reference_step = 0;
  size_t op = 0;                  // its recorded op index in `bundle`'s step
  size_t slot = 0;                // the output judged: the one furthest past its budget
  double introduced = 0;          // relative L2 of the recorded output against the op's fp64 run
  double budget = 0;              // relative L2: `budget_multiple` x this machine's rounding in `dtype`
  double budget_multiple = 0;
  std::string dtype;              // the output's recorded dtype ("bf16")
  int64_t threads = 0;            // intra-op threads it was recorded with; 0: unknown
  // How its call differs from the reference's ("argument 1 (other): 1 vs
  // 1.01"), "" when alike: then the fp64 run calls it as the reference does.
  std::string call_difference;
};

// Writes a script that judges one op (`cut`, of one op; the values of its
// leaves in `values`) as moerr diff does: it runs the op through torch.ops
// in fp64 (floating inputs and dtype arguments widened, autocast off) on
// the recorded inputs and raises AssertionError("op 148 aten::silu (M): the
// recorded output differs from aten::silu on its recorded inputs by 0.18
// (budget 0.007)") while the relative L2 of output `source.slot` as
// recorded (a leaf of `cut` with its value in `values`; "recorded_output"
// in the safetensors file) against that run exceeds the budget; `python
// SCRIPT DEVICE` judges the op's run on DEVICE instead. `called`: the op as
// the fp64 run calls it (`cut`'s op, or with `source.call_difference`, the
// reference's call of it on the same tensors). Returns that assertion. LibTorch may throw
// (schema lookups): callers catch at their boundary.
absl::StatusOr<std::string> WriteDivergenceScript(const std::string& script_path, const std::string& values_path,
                                                  const formats::Trace& cut, const formats::OpEvent& called,
                                                  const std::map<uint64_t, at::Tensor>& values,
                                                  const DivergenceSource& source);

// The op a vendor-op reduce keeps (vendor_reduce.h), for its script.
struct VendorSource {
  std::string bundle;            // the recording's path
  int64_t step = 0;
  size_t op = 0;                 // its recorded op index
  size_t slot = 0;               // the output judged: its most distant suspect one
  formats::DType dtype = formats::DType::kF32;  // that output's recorded dtype
  // The reference's file as the script finds it beside itself, and where it
  // was copied from.
  std::string reference_name, reference_origin;
  uint64_t allowance = 0;        // the reference's ULPs (op_references.h)
  uint64_t recorded_ulps = 0, allowed_ulps = 0;  // moerr's verdict, as the script asserts it
  int64_t threads = 0;           // intra-op threads it was recorded with; 0: unknown
};

// Writes a script that judges one vendor op (`cut`, of one op; its leaves'
// values in `values`, its recorded output `source.slot` among them) as
// moerr bisect and lint do: it runs the op's reference on the recorded
// inputs in float64 and in the recorded dtypes, and raises
// AssertionError("op 41 fakenpu::npu_swiglu_backward (mlp): the recorded
// output 0 is 8388615 ULPs of float32 from its reference in float64 (allowed
// 14)") while the recorded output is suspect (reference_run.h,
// JudgeAgainstReference); `python SCRIPT DEVICE` judges the op itself run on
// DEVICE. Returns that assertion. LibTorch may throw (schema lookups):
// callers catch at their boundary.
absl::StatusOr<std::string> WriteVendorScript(const std::string& script_path, const std::string& values_path,
                                              const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                                              const VendorSource& source);

}  // namespace moerr::replayer
