// rank-imbalance: the rows each rank of a run received in each all_to_all of
// the step (analysis/cross_rank.h, CheckRankBalance): the slowest rank sets
// the step time. A check of a run's step, every rank read.
#include "analysis/checks/common.h"
#include "analysis/cross_rank.h"

namespace moerr::analysis {
namespace {

class RankImbalance : public Check {
 public:
  absl::string_view name() const override { return "rank-imbalance"; }
  absl::string_view summary() const override {
    return "run directories: the rows each rank received in all_to_all, the busiest against the mean";
  }
  CheckScope scope() const override { return CheckScope::kRun; }
  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    const std::vector<Finding> found = CheckRankBalance(*input.world);
    out.insert(out.end(), found.begin(), found.end());
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Check> MakeRankImbalanceCheck() { return std::make_unique<RankImbalance>(); }

}  // namespace moerr::analysis
