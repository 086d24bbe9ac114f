// msprobe dumps written by the tests in msprobe's published layout
// (docs/IMPORT.md, "Sources"): DIR/step<N>/rank<K>/dump.json with
// construct.json and stack.json, and the tensor task's files under
// dump_tensor_data/ (torch.save's format, through LibTorch's pickle_save).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "llvm/Support/JSON.h"

namespace moerr::importers::testing {

// One API call: its inputs and outputs. Entry names follow msprobe:
// "Functional.linear.0.forward", "Functional.linear.0.backward".
struct FixtureEntry {
  std::string name;
  std::vector<at::Tensor> inputs, outputs;
  std::string parent;  // construct.json's parent module entry, or ""
};

// Writes DIR/step<step>/rank<rank>/ for `entries`: "statistics" (Max, Min,
// Mean, Norm computed as msprobe does, non-finite values as Python's bare
// NaN / Infinity words) or "tensor" (also one .pt per tensor).
void WriteMsprobeDump(const std::string& dir, int64_t step, int64_t rank, const std::string& task,
                      const std::vector<FixtureEntry>& entries);

// msprobe's statistics of one tensor, as dump.json holds them.
llvm::json::Object TensorJson(const at::Tensor& t, const std::string& data_name);

}  // namespace moerr::importers::testing
