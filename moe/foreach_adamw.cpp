#include "moe/foreach_adamw.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <map>

namespace moerr::moe {

ForeachAdamW::ForeachAdamW(std::vector<at::Tensor> params, double lr, double weight_decay, double beta1,
                           double beta2, double eps)
    : params_(std::move(params)),
      state_(params_.size()),
      lr_(lr),
      weight_decay_(weight_decay),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps) {}

void ForeachAdamW::Step() {
  torch::NoGradGuard no_grad;
  // Parameters by the update count they reach now: each group shares its
  // bias corrections (one group unless a restored state differs).
  std::map<int64_t, std::vector<size_t>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    State& s = state_[i];
    if (s.step == 0) {
      s.exp_avg = at::zeros_like(params_[i], at::MemoryFormat::Preserve);
      s.exp_avg_sq = at::zeros_like(params_[i], at::MemoryFormat::Preserve);
    }
    groups[s.step + 1].push_back(i);
  }
  for (const auto& [t, members] : groups) {
    std::vector<at::Tensor> p, g, m, v;
    for (size_t i : members) {
      p.push_back(params_[i]);
      g.push_back(params_[i].grad());
      m.push_back(state_[i].exp_avg);
      v.push_back(state_[i].exp_avg_sq);
      state_[i].step = t;
    }
    if (weight_decay_ != 0) at::_foreach_mul_(p, 1 - lr_ * weight_decay_);
    at::_foreach_mul_(m, beta1_);
    at::_foreach_add_(m, g, 1 - beta1_);
    at::_foreach_mul_(v, beta2_);
    at::_foreach_addcmul_(v, g, g, 1 - beta2_);
    const double correction1 = 1 - std::pow(beta1_, static_cast<double>(t));
    const double correction2 = 1 - std::pow(beta2_, static_cast<double>(t));
    std::vector<at::Tensor> denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, std::sqrt(correction2));
    at::_foreach_add_(denom, eps_);
    at::_foreach_addcdiv_(p, m, denom, -lr_ / correction1);
  }
}

}  // namespace moerr::moe
