// collective-order: per process group of a run, the first sequence number
// where the ranks' collectives disagree (analysis/collective_order.h): a
// rank that never entered it, entered another kind or other sizes. Such a
// step hangs until the collective timeout. A rank with no bundle or dump is
// a note: it is missing, not judged. A check of a run's step, every rank
// read.
#include "analysis/checks/common.h"
#include "analysis/collective_order.h"

namespace moerr::analysis {
namespace {

class CollectiveOrder : public Check {
 public:
  absl::string_view name() const override { return "collective-order"; }
  absl::string_view summary() const override {
    return "run directories: the first collective where the ranks of a group disagree, and who broke the order";
  }
  CheckScope scope() const override { return CheckScope::kRun; }
  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    for (const GroupOrder& g : CheckCollectiveOrder(*input.world)) {
      if (!g.Broken() && g.missing.empty()) continue;
      Finding f;
      f.check = std::string(name());
      f.severity = g.Broken() ? Severity::kError : Severity::kInfo;
      f.step = input.world->step;
      f.where = "group " + g.group;
      f.message = DescribeGroupOrder(g);
      f.numbers = GroupOrderJson(g);
      f.next = "moerr inspect " + input.world->dir;
      out.push_back(std::move(f));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Check> MakeCollectiveOrderCheck() { return std::make_unique<CollectiveOrder>(); }

}  // namespace moerr::analysis
