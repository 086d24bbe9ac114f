// AdamW over all parameters at once with LibTorch's multi-tensor
// `_foreach_*` ops, as PyTorch's AdamW(foreach=True) runs on accelerators: a
// dozen ops a step instead of a dozen per parameter. The update is
// torch::optim::AdamW's (amsgrad off), value for value: with g the gradient
// and t the parameter's update count,
//   p *= 1 - lr * weight_decay
//   m  = beta1 m + (1 - beta1) g
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace moerr::moe {

class ForeachAdamW {
 public:
  struct State {
    at::Tensor exp_avg, exp_avg_sq;  // undefined until the first update
    int64_t step = 0;                // updates applied
  };

  ForeachAdamW(std::vector<at::Tensor> params, double lr, double weight_decay, double beta1 = 0.9,
               double beta2 = 0.999, double eps = 1e-8);

  // Updates the parameters that have a gradient.
  void Step();

  const std::vector<at::Tensor>& params() const { return params_; }
  // One per parameter, in params() order.
  std::vector<State>& state() { return state_; }
  const std::vector<State>& state() const { return state_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<State> state_;
  double lr_, weight_decay_, beta1_, beta2_, eps_;
};

}  // namespace moerr::moe
