// load-imbalance: per MoE layer, the experts' share of the step's routed
// token slots (all routing decisions of the step together): dead experts (no
// token), the busiest expert against a fair share, and the normalised entropy
// of the load (1: uniform, 0: one expert takes everything). An expert can take
// at most E/k times its fair share (every token, with top-k routing), so the
// warning ratio is 3, or three quarters of the way from a fair share to that
// bound in layers with few experts.
#include <cmath>
#include <map>
#include <vector>

#include "analysis/checks/common.h"

namespace moerr::analysis {
namespace {

constexpr absl::string_view kName = "load-imbalance";
constexpr double kWarnRatio = 3.0;       // busiest expert / fair share that is a warning
constexpr double kWarnOfBound = 0.75;    // ... or this far from 1 towards the largest possible ratio, E / k

class LoadImbalance : public Check {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override { return "dead experts and the busiest expert's load, per MoE layer"; }

  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    const StepView& s = input.bundle;
    const std::map<int64_t, std::vector<int64_t>> counts = formats::TokensPerExpert(s.trace->routing);
    std::map<int64_t, int64_t> top_k;  // layer -> k
    for (const formats::RoutingRecord& r : s.trace->routing) {
      if (const formats::TensorInfo* ids = s.reader->FindTensor(r.topk_ids, s.step)) {
        const std::vector<int64_t>& shape = s.reader->index().blobs[ids->blob].shape;
        if (shape.size() == 2) top_k[r.layer] = shape[1];
      }
    }
    for (const auto& [layer, c] : counts) {
      int64_t total = 0, dead = 0, busiest = 0;
      for (size_t e = 0; e < c.size(); ++e) {
        total += c[e];
        dead += c[e] == 0;
        if (c[e] > c[busiest]) busiest = static_cast<int64_t>(e);
      }
      if (total == 0 || c.size() < 2) continue;
      double entropy = 0;
      for (int64_t n : c) {
        if (n > 0) entropy -= double(n) / total * std::log(double(n) / total);
      }
      entropy /= std::log(double(c.size()));
      const double ratio = double(c[busiest]) / total * c.size();
      const int64_t k = top_k.count(layer) ? std::max<int64_t>(1, top_k[layer]) : 1;
      const double warn_ratio = std::min(kWarnRatio, 1 + kWarnOfBound * (double(c.size()) / k - 1));
      // With k = E every expert takes every token: no imbalance to judge.
      const bool warn = dead > 0 || (warn_ratio > 1 && ratio >= warn_ratio);
      Finding f = checks::At(kName, warn ? Severity::kWarning : Severity::kInfo, s, absl::StrFormat("layer %d", layer));
      f.message = absl::StrFormat("expert %d takes %.2fx its fair share (%.1f%% of %d slots); %d of %d experts got no "
                                  "token; load entropy %.3f",
                                  busiest, ratio, 100.0 * c[busiest] / total, total, dead, c.size(), entropy);
      llvm::json::Array loads;
      for (int64_t n : c) loads.push_back(n);
      f.numbers = llvm::json::Object{{"slots", total},
                                     {"busiest_expert", busiest},
                                     {"busiest_vs_fair", ratio},
                                     {"dead_experts", dead},
                                     {"entropy", entropy},
                                     {"tokens_per_expert", std::move(loads)}};
      out.push_back(std::move(f));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Check> MakeLoadImbalanceCheck() { return std::make_unique<LoadImbalance>(); }

}  // namespace moerr::analysis
