// A reduction pass of `moerr reduce` (llvm-reduce style): proposes smaller
// versions of a step, most reduced first; the driver keeps the first that
// still fails the same way. One pass per file here, listed in reduce.cpp.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proxy/step_bundle.h"

namespace moerr::proxy {

struct Candidate {
  StepBundle bundle;
  std::string removed;  // for people: "experts per layer 8 -> 4"
};

class ReducePass {
 public:
  virtual ~ReducePass() = default;
  virtual absl::string_view name() const = 0;
  // Empty when nothing is left to remove.
  virtual std::vector<Candidate> Propose(const StepBundle& current) const = 0;
};

std::unique_ptr<ReducePass> MakePruneExpertsPass();
std::unique_ptr<ReducePass> MakePruneLayersPass();
std::unique_ptr<ReducePass> MakeTruncateTokensPass();
std::unique_ptr<ReducePass> MakeShrinkBatchPass();

}  // namespace moerr::proxy
