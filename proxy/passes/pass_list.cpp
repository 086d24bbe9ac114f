#include "proxy/passes/reduce_pass.h"

namespace moerr::proxy {

std::vector<std::unique_ptr<ReducePass>> AllReducePasses() {
  std::vector<std::unique_ptr<ReducePass>> passes;
#define MOERR_REDUCE_PASS(Name) passes.push_back(Make##Name##Pass());
#include "proxy/passes/passes.def"
#undef MOERR_REDUCE_PASS
  return passes;
}

}  // namespace moerr::proxy
