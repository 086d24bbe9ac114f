// DeepSeek-V3's multi-head latent attention (MLA), as HF transformers'
// DeepseekV3Attention computes it, with its HF parameter names:
//   q = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)))   per head [nope | rope]
//   [c, k_rope] = kv_a_proj_with_mqa(x)                     c: kv_lora_rank latent
//   [k_nope | v] = kv_b_proj(kv_a_layernorm(c))             per head
//   k = [k_nope | rotary(k_rope)], one k_rope shared by every head
//   out = o_proj(softmax(q.k * scale + mask) v)             from heads * v_head_dim
// with mask the causal one, narrowed to the layer's sliding window when it has
// one (HiddenKeys), scale = (qk_nope_head_dim + qk_rope_head_dim)^-0.5 (times
// mscale(factor, mscale_all_dim)^2 under rope scaling, AttentionDivisor) and
// rotary embeddings on the rope dims only.
// The two latent RMSNorms use eps 1e-6, as HF builds them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "moe/layers.h"
#include "moe/moe_config.h"

namespace moerr::moe {

class LatentAttentionImpl : public torch::nn::Module {
 public:
  // window: the layer's sliding window in tokens (MoeConfig::WindowOf); 0 = full.
  LatentAttentionImpl(const MoeConfig& config, std::string path, int64_t window = 0);
  at::Tensor forward(const at::Tensor& x);  // [B, S, hidden] -> [B, S, hidden], causal, windowed if window > 0

 private:
  // The queries [B, heads, S, qk_nope_head_dim + qk_rope_head_dim], rope dims rotated.
  at::Tensor Queries(const at::Tensor& x);
  // Rotary embeddings on x [B, n, S, qk_rope_head_dim], de-interleaved first under rope_interleave.
  at::Tensor Rotate(const at::Tensor& x) const;

  MoeConfig config_;
  std::string path_;
  int64_t window_;
  torch::nn::Linear q_proj_{nullptr}, q_a_proj_{nullptr}, q_b_proj_{nullptr};
  torch::nn::Linear kv_a_proj_with_mqa_{nullptr}, kv_b_proj_{nullptr}, o_proj_{nullptr};
  RMSNorm q_a_layernorm_{nullptr}, kv_a_layernorm_{nullptr};
};
TORCH_MODULE(LatentAttention);

}  // namespace moerr::moe
