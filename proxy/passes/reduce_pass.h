// A reduction pass of `moerr reduce` (llvm-reduce style): proposes smaller
// versions of a step, most reduced first; the driver keeps the first that
// still fails the same way. One pass per file here, listed in passes.def.
#pragma once

#include <memory>
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

#define MOERR_REDUCE_PASS(Name) std::unique_ptr<ReducePass> Make##Name##Pass();
#include "proxy/passes/passes.def"
#undef MOERR_REDUCE_PASS

// Every pass of passes.def, in its order.
std::vector<std::unique_ptr<ReducePass>> AllReducePasses();

}  // namespace moerr::proxy
