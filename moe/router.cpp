#include "moe/router.h"

#include <ATen/record_function.h>
#include <torch/nn/init.h>

#include "support/check.h"

namespace moerr::moe {

RouterImpl::RouterImpl(const MoeConfig& config, int64_t layer, std::string path)
    : config_(config), layer_(layer), path_(std::move(path)) {
  weight = register_parameter("weight", torch::empty({config.num_experts, config.hidden_size}));
  torch::nn::init::normal_(weight, 0.0, 0.02);
  if (config.router == RouterKind::kSigmoidGroupedTopK) {
    e_score_correction_bias = register_buffer("e_score_correction_bias", torch::zeros({config.num_experts}));
  }
}

at::Tensor RouterImpl::SelectGrouped(const at::Tensor& choice) const {
  const int64_t t = choice.size(0), groups = config_.n_group, per_group = config_.num_experts / groups;
  const at::Tensor grouped = choice.view({t, groups, per_group});
  const at::Tensor group_scores = std::get<0>(grouped.topk(std::min<int64_t>(2, per_group), -1)).sum(-1);  // [T, G]
  const at::Tensor top_groups = std::get<1>(group_scores.topk(config_.topk_group, -1));                  // [T, g]
  const at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, top_groups, 1.0);
  const at::Tensor expert_mask = group_mask.unsqueeze(-1).expand({t, groups, per_group}).reshape({t, -1});
  const at::Tensor masked = choice.masked_fill(expert_mask.eq(0), -std::numeric_limits<float>::infinity());
  return std::get<1>(masked.topk(config_.top_k, -1));
}

RouterOutput RouterImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  RouterOutput out;
  out.logits = at::linear(x.to(at::kFloat), weight.to(at::kFloat));  // [T, E]
  at::Tensor scores;
  if (config_.router == RouterKind::kSoftmaxTopK) {
    scores = at::softmax(out.logits, -1);
    out.probs = scores;
  } else {
    scores = at::sigmoid(out.logits);
    out.probs = scores / scores.sum(-1, /*keepdim=*/true);
  }
  if (config_.router == RouterKind::kSoftmaxTopK) {
    out.topk_ids = std::get<1>(scores.topk(config_.top_k, -1));
  } else {
    out.topk_ids = SelectGrouped(scores.detach() + e_score_correction_bias);
  }
  if (source_ != nullptr) {
    out.topk_ids = source_->Route(layer_, out.topk_ids, config_.num_experts);
    MOERR_CHECK(out.topk_ids.sizes() == at::IntArrayRef({x.size(0), config_.top_k}))
        << "routing source gave " << out.topk_ids.sizes() << " at layer " << layer_;
  }
  at::Tensor w = scores.gather(1, out.topk_ids);
  if (config_.norm_topk_prob) w = w / (w.sum(-1, /*keepdim=*/true) + 1e-20);
  w = w * config_.routed_scaling_factor;
  out.topk_weights = w.to(x.scalar_type());
  if (observer_ != nullptr) observer_->OnRouting({layer_, out.topk_ids, out.topk_weights, out.logits, x});
  return out;
}

}  // namespace moerr::moe
