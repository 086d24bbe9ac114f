// The MoE router: scores experts per token and picks top-k.
//   softmax top-k:  p = softmax(logits); top-k of p; optional renormalisation.
//   DeepSeek-V3:    s = sigmoid(logits); choice = s + e_score_correction_bias;
//                   keep the topk_group groups with the best top-2 sums; top-k
//                   of choice within them; weights from s (renormalised), times
//                   routed_scaling_factor.
// Routing replay: a RoutingSource may replace the choice per call; the weights
// still come from the live scores, so gradients flow.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "moe/moe_config.h"
#include "recorder/hooks/routing_hook.h"

namespace moerr::moe {

struct RouterOutput {
  at::Tensor topk_ids;      // [T, k] int64
  at::Tensor topk_weights;  // [T, k], input dtype
  at::Tensor logits;        // [T, E] fp32
  at::Tensor probs;         // [T, E] fp32: softmax, or sigmoid scores normalised per token
};

class RouterImpl : public torch::nn::Module {
 public:
  RouterImpl(const MoeConfig& config, int64_t layer, std::string path);
  RouterOutput forward(const at::Tensor& x);  // x [T, hidden]

  void set_observer(recorder::RoutingObserver* observer) { observer_ = observer; }
  void set_source(recorder::RoutingSource* source) { source_ = source; }
  int64_t layer() const { return layer_; }

  at::Tensor weight;                   // [E, hidden]
  at::Tensor e_score_correction_bias;  // [E], DeepSeek-V3 only (a buffer)

 private:
  at::Tensor SelectGrouped(const at::Tensor& choice) const;

  MoeConfig config_;
  int64_t layer_;
  std::string path_;
  recorder::RoutingObserver* observer_ = nullptr;
  recorder::RoutingSource* source_ = nullptr;
};
TORCH_MODULE(Router);

}  // namespace moerr::moe
