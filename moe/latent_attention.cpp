#include "moe/latent_attention.h"

#include <ATen/record_function.h>

#include <limits>

#include "moe/numerics.h"

namespace moerr::moe {
namespace {

// HF builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not rms_norm_eps.
constexpr double kLatentNormEps = 1e-6;

torch::nn::Linear Linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

LatentAttentionImpl::LatentAttentionImpl(const MoeConfig& config, std::string path, int64_t window)
    : config_(config), path_(std::move(path)), window_(window) {
  const MoeConfig& c = config;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  // Registration order is HF's, so named_parameters() lists the tensors as a checkpoint does.
  if (c.q_lora_rank == 0) {
    q_proj_ = register_module("q_proj", Linear(c.hidden_size, c.num_heads * qk));
  } else {
    q_a_proj_ = register_module("q_a_proj", Linear(c.hidden_size, c.q_lora_rank));
    q_a_layernorm_ = register_module("q_a_layernorm", RMSNorm(c.q_lora_rank, kLatentNormEps));
    q_b_proj_ = register_module("q_b_proj", Linear(c.q_lora_rank, c.num_heads * qk));
  }
  kv_a_proj_with_mqa_ =
      register_module("kv_a_proj_with_mqa", Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim));
  kv_a_layernorm_ = register_module("kv_a_layernorm", RMSNorm(c.kv_lora_rank, kLatentNormEps));
  kv_b_proj_ = register_module("kv_b_proj", Linear(c.kv_lora_rank, c.num_heads * (c.qk_nope_head_dim + c.v_head_dim)));
  o_proj_ = register_module("o_proj", Linear(c.num_heads * c.v_head_dim, c.hidden_size));
}

at::Tensor LatentAttentionImpl::Rotate(const at::Tensor& x) const {
  if (!config_.rope_interleave) return ApplyRotary(x, config_);
  // (x0, y0, x1, y1, ...) -> (x0, x1, ..., y0, y1, ...): the halves layout ApplyRotary rotates.
  const int64_t b = x.size(0), n = x.size(1), s = x.size(2), d = x.size(3);
  return ApplyRotary(x.reshape({b, n, s, d / 2, 2}).transpose(4, 3).reshape({b, n, s, d}), config_);
}

at::Tensor LatentAttentionImpl::Queries(const at::Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1), nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const at::Tensor flat = q_proj_ ? q_proj_(x) : q_b_proj_(q_a_layernorm_(Boundary(q_a_proj_(x))));
  const at::Tensor q = Boundary(flat).view({b, s, config_.num_heads, nope + rope}).transpose(1, 2);
  return at::cat({q.narrow(-1, 0, nope), Rotate(q.narrow(-1, nope, rope))}, -1);
}

at::Tensor LatentAttentionImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  const int64_t b = x.size(0), s = x.size(1), heads = config_.num_heads;
  const int64_t nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim, vd = config_.v_head_dim;
  const int64_t rank = config_.kv_lora_rank;
  const at::Tensor q = Queries(x);                                  // [B, heads, S, nope + rope]
  const at::Tensor compressed = Boundary(kv_a_proj_with_mqa_(x));  // [B, S, rank + rope]
  const at::Tensor latent = kv_a_layernorm_(compressed.narrow(-1, 0, rank));
  const at::Tensor kv = Boundary(kv_b_proj_(latent)).view({b, s, heads, nope + vd}).transpose(1, 2);
  // One rotary key [B, 1, S, rope] for every head.
  const at::Tensor k_rope = Rotate(compressed.narrow(-1, rank, rope).reshape({b, 1, s, rope}));
  const at::Tensor k = at::cat({kv.narrow(-1, 0, nope), k_rope.expand({b, heads, s, rope})}, -1);
  const at::Tensor v = kv.narrow(-1, nope, vd);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / AttentionDivisor(config_);
  scores = Boundary(scores).masked_fill(HiddenKeys(s, window_), -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  const at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape({b, s, heads * vd});
  return Boundary(o_proj_(Boundary(out)));
}

}  // namespace moerr::moe
