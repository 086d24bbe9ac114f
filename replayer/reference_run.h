// The parts of program replay that run an op's reference (op_references.h)
// and judge a recorded output against it (docs/REPLAY.md, "Ops this LibTorch
// does not have"); used by program_replay.cpp alone.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"
#include "formats/trace.h"
#include "replayer/op_references.h"
#include "replayer/program_replay.h"

namespace moerr::replayer {

// The outputs of `op`'s reference in `references` on `args`, without
// autocast (it is left off), as many as the op recorded: a trailing empty
// output of a newer schema that the recorded op lacks is dropped. An error
// when the reference raises (it refuses the call) or returns another number.
absl::StatusOr<std::vector<at::Tensor>> RunReferenceOf(const OpReferences& references, const formats::OpEvent& op,
                                                       const std::vector<c10::IValue>& args);

// Why a reference refused a call, in its own words: the last line of a
// TorchScript error ("builtins.RuntimeError: npu_fusion_attention reference:
// sparse_mode 5 is not implemented (0 to 4 are)") without the error's type
// and the reference's name; any other error's message as it is.
std::string RefusalReason(const absl::Status& status);

// `v` with its floating tensors in fp64: a reference's exact run.
c10::IValue Widen(const c10::IValue& v);

// The verdict on `recorded`, an output of the vendor op, against `exact`,
// the reference's fp64 run, beside `mine`, the reference's run in the
// recorded dtypes; `allowance` is the reference's ULPs (op_references.h).
// Fills the ULPs, relative L2 errors, allowed_ulps and suspect.
absl::StatusOr<ReferenceCheck> JudgeAgainstReference(const formats::TensorView& recorded, const at::Tensor& exact,
                                                     const at::Tensor& mine, uint64_t allowance);

}  // namespace moerr::replayer
