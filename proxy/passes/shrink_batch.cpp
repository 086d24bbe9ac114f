// shrink-batch: halve the prompts of the step (down to one), or the
// responses sampled per prompt (down to two, GRPO's smallest group). The
// recorded routing was made for the whole batch, so a candidate routes live:
// the failure must reproduce without it.
#include "absl/strings/str_format.h"
#include "proxy/passes/reduce_pass.h"

namespace moerr::proxy {
namespace {

class ShrinkBatch : public ReducePass {
 public:
  absl::string_view name() const override { return "shrink-batch"; }

  std::vector<Candidate> Propose(const StepBundle& current) const override {
    std::vector<Candidate> out;
    const moe::GrpoOptions& o = current.options;
    if (o.prompts > 1) {
      Candidate cand{current, absl::StrFormat("prompts per step %d -> %d (routing live)", o.prompts, o.prompts / 2)};
      cand.bundle.options.prompts /= 2;
      cand.bundle.routing.clear();
      out.push_back(std::move(cand));
    }
    if (o.group_size / 2 >= 2) {
      Candidate cand{current, absl::StrFormat("responses per prompt %d -> %d (routing live)", o.group_size,
                                              o.group_size / 2)};
      cand.bundle.options.group_size /= 2;
      cand.bundle.routing.clear();
      out.push_back(std::move(cand));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ReducePass> MakeShrinkBatchPass() { return std::make_unique<ShrinkBatch>(); }

}  // namespace moerr::proxy
