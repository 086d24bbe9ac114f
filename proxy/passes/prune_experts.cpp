// prune-experts: halve the experts of every MoE layer (down to top-k), keeping
// the implicated expert and the most selected ones of the step's recorded
// routing; a dropped expert's decisions go to the kept expert whose router
// row is closest (cosine). Surgery as the proxy's (surgery.h).
#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"
#include "proxy/clustering.h"
#include "proxy/passes/reduce_pass.h"
#include "proxy/surgery.h"

namespace moerr::proxy {
namespace {

class PruneExperts : public ReducePass {
 public:
  absl::string_view name() const override { return "prune-experts"; }

  std::vector<Candidate> Propose(const StepBundle& current) const override {
    const moe::MoeConfig& c = current.config;
    const int64_t groups = c.router == moe::RouterKind::kSigmoidGroupedTopK ? c.n_group : 1;
    const int64_t keep = std::max<int64_t>(c.num_experts / 2, std::max<int64_t>(c.top_k, groups));
    // Grouped routing's per-group quotas are the proxy command's job.
    if (keep >= c.num_experts || groups > 1) return {};
    std::map<std::string, at::Tensor> tensors(current.state.tensors.begin(), current.state.tensors.end());
    std::vector<LayerPlan> plans;
    for (int64_t layer = c.first_k_dense; layer < c.num_layers; ++layer) {
      if (!c.IsMoeLayer(layer)) continue;
      at::Tensor freq = at::zeros({c.num_experts}, at::kDouble);
      for (const RoutingEntry& r : current.routing) {
        if (r.layer == layer) freq += at::bincount(r.ids.reshape({-1}), {}, c.num_experts).to(at::kDouble);
      }
      LayerPlan plan;
      plan.layer = layer;
      for (const auto& [l, e] : current.implicated) {
        if (l == layer) plan.kept.push_back(e);
      }
      std::vector<int64_t> order(c.num_experts);
      std::iota(order.begin(), order.end(), 0);
      const auto f = freq.accessor<double, 1>();
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return f[a] > f[b]; });
      for (int64_t e : order) {
        if (static_cast<int64_t>(plan.kept.size()) >= keep) break;
        if (std::find(plan.kept.begin(), plan.kept.end(), e) == plan.kept.end()) plan.kept.push_back(e);
      }
      std::sort(plan.kept.begin(), plan.kept.end());
      const at::Tensor sim =
          CosineSimilarity(tensors.at(absl::StrFormat("policy/model.layers.%d.%s.gate.weight", layer, c.MlpName())));
      plan.medoid_of.resize(c.num_experts);
      const auto s = sim.accessor<double, 2>();
      for (int64_t e = 0; e < c.num_experts; ++e) {
        int64_t best = plan.kept.front();
        for (int64_t k : plan.kept) {
          if (s[e][k] > s[e][best]) best = k;
        }
        const bool kept = std::find(plan.kept.begin(), plan.kept.end(), e) != plan.kept.end();
        plan.medoid_of[e] = kept ? e : best;
      }
      plans.push_back(std::move(plan));
    }
    auto config = ProxyConfig(c, keep);
    if (!config.ok()) return {};
    return {Candidate{PruneStep(current, *config, plans),
                      absl::StrFormat("experts per MoE layer %d -> %d", c.num_experts, keep)}};
  }
};

}  // namespace

std::unique_ptr<ReducePass> MakePruneExpertsPass() { return std::make_unique<PruneExperts>(); }

}  // namespace moerr::proxy
