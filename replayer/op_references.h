// Reference implementations of ops, as TorchScript files (docs/REPLAY.md,
// "Ops this LibTorch does not have"). A reference stands in for an op that
// this LibTorch lacks (a vendor's fused kernel recorded on an NPU or GPU)
// wherever the op appears in a replayed step, and isolated replay checks the
// recorded op against it.
//
// A reference's `forward` takes the op's arguments in schema order and
// returns its outputs (a tensor or a tuple of tensors). It takes either every
// argument, or the tensor arguments alone: the arity of `forward` decides. A
// call with fewer arguments than `forward` takes, all of whose missing
// trailing ones have defaults (an op recorded with an older schema), passes
// every argument and the defaults fill the rest.
//
// moerr ships references for torch_npu's fused ops (references/, built to
// share/moerr/references next to bin/): a list file, `references.list`, with
// one "OP FILE ULPS" line per op, ULPS being the verdict's allowance (below).
// They load by name; `--reference OP=FILE` adds one or replaces a shipped one.
// Only op_references.cpp includes torch/script.h (a slow header).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moerr::replayer {

// The ULPs of slack a user's reference gets by default (see `ulps`).
inline constexpr uint64_t kDefaultReferenceUlps = 4;

class OpReferences {
 public:
  struct Info {
    std::string file;
    // A recorded output is judged suspect when its distance from the fp64
    // reference, in ULPs of its dtype, exceeds twice the larger of this and
    // the reference's own distance from its fp64 run.
    uint64_t ulps = kDefaultReferenceUlps;
  };

  // No references.
  OpReferences();
  ~OpReferences();
  OpReferences(OpReferences&&) noexcept;
  OpReferences& operator=(OpReferences&&) noexcept;

  // The shipped references (when `shipped` and their list is found), then
  // each "OP=FILE" of `specs` (a missing FILE is an error). Files load on
  // first use.
  static absl::StatusOr<OpReferences> Load(const std::vector<std::string>& specs, bool shipped = true);
  // The folder of the shipped references: $MOERR_REFERENCES if set, else
  // share/moerr/references beside the running binary's bin/ (the build
  // tree mirrors the installed layout); "" when neither holds a list.
  static std::string ShippedDir();

  const Info* Find(absl::string_view op) const;
  const std::map<std::string, Info>& all() const { return info_; }

  // Runs the reference of `op` on `args` (every argument of the op in schema
  // order; only the tensors are passed when `forward` takes fewer) and
  // returns its outputs, flattened; a non-tensor element of a returned tuple
  // is an undefined tensor. LibTorch errors come back as a Status.
  absl::StatusOr<std::vector<at::Tensor>> Run(absl::string_view op, const std::vector<c10::IValue>& args) const;

 private:
  struct Module;  // a loaded torch::jit::Module
  std::map<std::string, Info> info_;
  mutable std::map<std::string, std::shared_ptr<Module>> loaded_;
};

}  // namespace moerr::replayer
