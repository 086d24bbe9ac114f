#include "moe/layers.h"

#include <ATen/record_function.h>

#include <cmath>

#include "moe/numerics.h"

namespace moerr::moe {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return Boundary((weight * normed).to(x.scalar_type()));
}

at::Tensor ApplyRotary(const at::Tensor& x, double theta) {
  const int64_t seq = x.size(2), dim = x.size(3), half = dim / 2;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, half, opts) * 2.0 / dim);
  const at::Tensor freqs = at::outer(at::arange(seq, opts), inv_freq);  // [S, half]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                  // [S, dim]
  const at::Tensor cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

AttentionImpl::AttentionImpl(const MoeConfig& config, std::string path) : config_(config), path_(std::move(path)) {
  const int64_t h = config.hidden_size, d = config.head_dim;
  q_proj_ = register_module("q_proj", torch::nn::Linear(torch::nn::LinearOptions(h, config.num_heads * d).bias(config.attention_bias)));
  k_proj_ = register_module("k_proj", torch::nn::Linear(torch::nn::LinearOptions(h, config.num_kv_heads * d).bias(config.attention_bias)));
  v_proj_ = register_module("v_proj", torch::nn::Linear(torch::nn::LinearOptions(h, config.num_kv_heads * d).bias(config.attention_bias)));
  o_proj_ = register_module("o_proj", torch::nn::Linear(torch::nn::LinearOptions(config.num_heads * d, h).bias(false)));
  if (config.qk_norm) {
    q_norm_ = register_module("q_norm", RMSNorm(d, config.rms_norm_eps));
    k_norm_ = register_module("k_norm", RMSNorm(d, config.rms_norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  const int64_t b = x.size(0), s = x.size(1), d = config_.head_dim;
  at::Tensor q = Boundary(q_proj_(x)).view({b, s, config_.num_heads, d}).transpose(1, 2);
  at::Tensor k = Boundary(k_proj_(x)).view({b, s, config_.num_kv_heads, d}).transpose(1, 2);
  at::Tensor v = Boundary(v_proj_(x)).view({b, s, config_.num_kv_heads, d}).transpose(1, 2);
  if (config_.qk_norm) {
    q = q_norm_(q);
    k = k_norm_(k);
  }
  q = ApplyRotary(q, config_.rope_theta);
  k = ApplyRotary(k, config_.rope_theta);
  const int64_t groups = config_.num_heads / config_.num_kv_heads;
  if (groups > 1) {
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  const at::Tensor mask = at::ones({s, s}, at::TensorOptions().dtype(at::kBool)).triu(1);
  scores = Boundary(scores).masked_fill(mask, -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  const at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape({b, s, config_.num_heads * d});
  return Boundary(o_proj_(Boundary(out)));
}

ExpertImpl::ExpertImpl(int64_t hidden, int64_t intermediate, bool mixtral_names, std::string path)
    : path_(std::move(path)) {
  auto linear = [](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
  gate_ = register_module(mixtral_names ? "w1" : "gate_proj", linear(hidden, intermediate));
  up_ = register_module(mixtral_names ? "w3" : "up_proj", linear(hidden, intermediate));
  down_ = register_module(mixtral_names ? "w2" : "down_proj", linear(intermediate, hidden));
}

at::Tensor ExpertImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  const at::Tensor act = Boundary(at::silu(Boundary(gate_(x))) * Boundary(up_(x)));
  return Boundary(down_(act));
}

}  // namespace moerr::moe
