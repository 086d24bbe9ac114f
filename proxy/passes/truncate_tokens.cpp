// truncate-tokens: halve the response tokens each sequence samples (down to
// one); rewards compare that prefix of the answer. The recorded routing was
// made for whole sequences, so the candidate routes live: the failure must
// reproduce without it.
#include "absl/strings/str_format.h"
#include "moe/addition_task.h"
#include "proxy/passes/reduce_pass.h"

namespace moerr::proxy {
namespace {

class TruncateTokens : public ReducePass {
 public:
  absl::string_view name() const override { return "truncate-tokens"; }

  std::vector<Candidate> Propose(const StepBundle& current) const override {
    const int64_t tokens = moe::ResponseTokens(current.options, moe::AdditionTask());
    if (tokens <= 1) return {};
    Candidate cand{current, absl::StrFormat("response tokens %d -> %d (routing live)", tokens, tokens / 2)};
    cand.bundle.options.response_tokens = tokens / 2;
    cand.bundle.routing.clear();
    return {std::move(cand)};
  }
};

}  // namespace

std::unique_ptr<ReducePass> MakeTruncateTokensPass() { return std::make_unique<TruncateTokens>(); }

}  // namespace moerr::proxy
