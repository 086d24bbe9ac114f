// shrink-batch: halve the prompts of the step (down to one group). The
// recorded routing was made for the whole batch, so the candidate routes
// live: the failure must reproduce without it.
#include "absl/strings/str_format.h"
#include "proxy/passes/reduce_pass.h"

namespace moerr::proxy {
namespace {

class ShrinkBatch : public ReducePass {
 public:
  absl::string_view name() const override { return "shrink-batch"; }

  std::vector<Candidate> Propose(const StepBundle& current) const override {
    if (current.options.prompts <= 1) return {};
    Candidate cand{current, absl::StrFormat("prompts per step %d -> %d (routing live)", current.options.prompts,
                                            current.options.prompts / 2)};
    cand.bundle.options.prompts /= 2;
    cand.bundle.routing.clear();
    return {std::move(cand)};
  }
};

}  // namespace

std::unique_ptr<ReducePass> MakeShrinkBatchPass() { return std::make_unique<ShrinkBatch>(); }

}  // namespace moerr::proxy
