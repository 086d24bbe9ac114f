#include "proxy/surgery.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <regex>

#include "absl/strings/str_format.h"

namespace moerr::proxy {
namespace {

const LayerPlan* PlanOf(const std::vector<LayerPlan>& plans, int64_t layer) {
  for (const LayerPlan& p : plans) {
    if (p.layer == layer) return &p;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<moe::MoeConfig> ProxyConfig(const moe::MoeConfig& original, int64_t kept) {
  moe::MoeConfig c = original;
  if (kept < 1 || kept > original.num_experts) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot keep %d of %d experts", kept, original.num_experts));
  }
  c.num_experts = kept;
  c.top_k = std::min(original.top_k, kept);
  if (c.router == moe::RouterKind::kSigmoidGroupedTopK && c.n_group > 1 && kept % c.n_group == 0) {
    c.topk_group = std::min(c.topk_group, c.n_group);
    if (kept == c.n_group) {
      // Groups of one expert: a group's score is its expert's, so the
      // routing is the top min(top_k, topk_group) experts of them all, which
      // one group says (transformers scores a group by its top two experts
      // and cannot take groups of one).
      c.top_k = std::min(c.top_k, c.topk_group);
      c.n_group = 1;
      c.topk_group = 1;
    } else {
      c.top_k = std::min(c.top_k, c.topk_group * (kept / c.n_group));  // the experts the eligible groups hold
    }
  }
  if (absl::Status s = moe::Validate(c); !s.ok()) return s;
  return c;
}

std::optional<std::pair<std::string, at::Tensor>> MapTensor(const std::string& name, const at::Tensor& t,
                                                            const std::vector<LayerPlan>& plans) {
  // [prefix/]model.layers.L.MLP.experts.E.REST and [prefix/]model.layers.L.MLP.gate.(weight|e_score_correction_bias)
  static const std::regex expert(R"(^(.*model\.layers\.)(\d+)(\.\w+\.experts\.)(\d+)(\..*)$)");
  static const std::regex gate(R"(^(.*model\.layers\.)(\d+)\.\w+\.gate\.(weight|e_score_correction_bias)$)");
  std::smatch m;
  if (std::regex_match(name, m, expert)) {
    const LayerPlan* plan = PlanOf(plans, std::stoll(m[2]));
    if (plan == nullptr) return std::make_pair(name, t);
    const int64_t e = std::stoll(m[4]);
    auto it = std::find(plan->kept.begin(), plan->kept.end(), e);
    if (it == plan->kept.end()) return std::nullopt;
    return std::make_pair(absl::StrFormat("%s%s%s%d%s", m[1].str(), m[2].str(), m[3].str(), it - plan->kept.begin(),
                                          m[5].str()),
                          t);
  }
  if (std::regex_match(name, m, gate)) {
    const LayerPlan* plan = PlanOf(plans, std::stoll(m[2]));
    if (plan == nullptr || t.dim() < 1 || t.size(0) != static_cast<int64_t>(plan->medoid_of.size())) {
      return std::make_pair(name, t);
    }
    const at::Tensor rows = at::tensor(plan->kept, at::kLong);
    return std::make_pair(name, t.index_select(0, rows));
  }
  return std::make_pair(name, t);
}

StepBundle PruneStep(const StepBundle& step, const moe::MoeConfig& proxy_config, const std::vector<LayerPlan>& plans) {
  StepBundle out = step;
  out.config = proxy_config;
  out.state = MapTrainerState(step.state,
                              [&](const std::string& name, const at::Tensor& t) { return MapTensor(name, t, plans); });
  for (RoutingEntry& r : out.routing) {
    if (const LayerPlan* p = PlanOf(plans, r.layer)) {
      r.ids = MapRouting(r.ids, r.logits, *p, proxy_config.top_k);
      r.weights = at::Tensor();  // recorded for the original's experts
      if (r.logits.defined()) r.logits = r.logits.index_select(1, at::tensor(p->kept, at::kLong)).contiguous();
    }
  }
  for (auto& [layer, expert] : out.implicated) {
    if (const LayerPlan* p = PlanOf(plans, layer)) {
      expert = std::find(p->kept.begin(), p->kept.end(), expert) - p->kept.begin();
    }
  }
  return out;
}

at::Tensor MapRouting(const at::Tensor& ids, const at::Tensor& logits, const LayerPlan& plan, int64_t top_k) {
  const int64_t tokens = ids.size(0), experts = static_cast<int64_t>(plan.medoid_of.size());
  std::vector<int64_t> new_index(experts, -1);
  for (size_t i = 0; i < plan.kept.size(); ++i) new_index[plan.kept[i]] = static_cast<int64_t>(i);
  const at::Tensor ids_cpu = ids.to(at::kLong).contiguous();
  const auto in = ids_cpu.accessor<int64_t, 2>();
  const at::Tensor scores = logits.defined() ? logits.to(at::kDouble).contiguous() : at::Tensor();
  at::Tensor out = at::empty({tokens, top_k}, at::kLong);
  auto o = out.accessor<int64_t, 2>();
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> chosen;
    for (int64_t j = 0; j < ids.size(1) && static_cast<int64_t>(chosen.size()) < top_k; ++j) {
      const int64_t mapped = new_index[plan.medoid_of[in[t][j]]];
      if (std::find(chosen.begin(), chosen.end(), mapped) == chosen.end()) chosen.push_back(mapped);
    }
    // Backfill: the best remaining kept experts by the recorded logits.
    std::vector<int64_t> rest;
    for (int64_t i = 0; i < static_cast<int64_t>(plan.kept.size()); ++i) {
      if (std::find(chosen.begin(), chosen.end(), i) == chosen.end()) rest.push_back(i);
    }
    if (scores.defined()) {
      const auto sc = scores.accessor<double, 2>();
      std::stable_sort(rest.begin(), rest.end(),
                       [&](int64_t a, int64_t b) { return sc[t][plan.kept[a]] > sc[t][plan.kept[b]]; });
    }
    for (size_t r = 0; static_cast<int64_t>(chosen.size()) < top_k && r < rest.size(); ++r) chosen.push_back(rest[r]);
    for (int64_t j = 0; j < top_k; ++j) o[t][j] = chosen[j];
  }
  return out;
}

}  // namespace moerr::proxy
