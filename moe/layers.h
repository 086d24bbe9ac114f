// The building blocks of the reference transformer: RMSNorm, rotary
// embeddings, GQA attention (MLA: latent_attention.h) and the SwiGLU expert. Each module pushes its
// HF-style path ("model.layers.3.mlp.experts.5") as a record-function user
// scope, so a trace names the module of every op.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "moe/moe_config.h"

namespace moerr::moe {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);  // [..., dim], normalised in fp32

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  // window: the layer's sliding window in tokens (MoeConfig::WindowOf); 0 = full.
  AttentionImpl(const MoeConfig& config, std::string path, int64_t window = 0);
  at::Tensor forward(const at::Tensor& x);  // [B, S, hidden] -> [B, S, hidden], causal, windowed if window > 0

 private:
  MoeConfig config_;
  std::string path_;
  int64_t window_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  RMSNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(Attention);

// Gated MLP: down(act(gate(x)) * up(x)), act = hidden_act (SwiGLU with
// silu). Also the dense MLP and shared experts. Mixtral names the
// projections w1 (gate), w3 (up), w2 (down).
class ExpertImpl : public torch::nn::Module {
 public:
  ExpertImpl(int64_t hidden, int64_t intermediate, bool mixtral_names, std::string path,
             Activation act = Activation::kSilu);
  at::Tensor forward(const at::Tensor& x);  // [N, hidden] or [B, S, hidden]

 private:
  at::Tensor Activate(const at::Tensor& gate) const;  // hidden_act

  std::string path_;
  Activation act_;
  torch::nn::Linear gate_{nullptr}, up_{nullptr}, down_{nullptr};
};
TORCH_MODULE(Expert);

// Applies rotary embeddings to x [B, heads, S, dim] (HF layout: halves),
// dim = x.size(3) (head_dim, or MLA's qk_rope_head_dim), with
// config.rope_theta and config.rope_scaling.
at::Tensor ApplyRotary(const at::Tensor& x, const MoeConfig& config);
// What q.k is divided by: sqrt of a head's q.k dims (head_dim, or MLA's
// qk_nope_head_dim + qk_rope_head_dim), over mscale(factor, mscale_all_dim)^2
// in DeepSeek-V3 when rope_scaling has a type and mscale_all_dim is set.
double AttentionDivisor(const MoeConfig& config);
// The positions a query must not see, [S, S] bool, true = hidden: the keys
// after it and, with window > 0, those window or more positions before it.
at::Tensor HiddenKeys(int64_t seq, int64_t window);

}  // namespace moerr::moe
