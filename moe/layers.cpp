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

namespace {

// yarn's magnitude correction: 0.1 * m * ln(scale) + 1 past scale 1.
double YarnMscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The dim index at which a wavelength makes `rotations` turns over `max_pos` tokens.
double YarnCorrectionDim(double rotations, int64_t dim, double theta, int64_t max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * M_PI)) / (2 * std::log(theta));
}

// yarn: inv_freq [dim/2] blended between inv_freq / factor and inv_freq over
// the correction range, and the factor on cos and sin (transformers' _compute_yarn_parameters).
std::pair<at::Tensor, double> Yarn(const RopeScaling& s, const at::Tensor& inv_freq, int64_t dim, double theta) {
  const int64_t half = dim / 2, max_pos = s.original_max_position_embeddings;
  double low = YarnCorrectionDim(s.beta_fast, dim, theta, max_pos);
  double high = YarnCorrectionDim(s.beta_slow, dim, theta, max_pos);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(0.0, low);
  high = std::min<double>(dim - 1, high);
  if (low == high) high += 0.001;
  // 1 keeps a dim's original frequency (fast rotations), 0 interpolates it.
  const at::Tensor keep = 1.0 - ((at::arange(half, inv_freq.options()) - low) / (high - low)).clamp(0, 1);
  double magnitude = s.attention_factor;
  if (magnitude == 0) {
    magnitude = s.mscale != 0 && s.mscale_all_dim != 0
                    ? YarnMscale(s.factor, s.mscale) / YarnMscale(s.factor, s.mscale_all_dim)
                    : YarnMscale(s.factor, 1.0);
  }
  return {inv_freq / s.factor * (1.0 - keep) + inv_freq * keep, magnitude};
}

// llama3: long wavelengths divided by factor, short ones kept, the band
// between blended (transformers' _compute_llama3_parameters).
at::Tensor Llama3(const RopeScaling& s, const at::Tensor& inv_freq) {
  const double original = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = original / s.low_freq_factor, high_wavelen = original / s.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv_freq;
  const at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor blended = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
  return at::where(medium, blended, scaled);
}

// inv_freq [dim/2] for a sequence of `seq` tokens, and the factor on cos and sin.
std::pair<at::Tensor, double> RotaryFrequencies(const MoeConfig& c, int64_t seq, int64_t dim) {
  const int64_t half = dim / 2;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const RopeScaling& s = c.rope_scaling;
  double theta = c.rope_theta;
  if (s.type == RopeScalingType::kDynamic && seq > c.max_position_embeddings) {
    theta *= std::pow(s.factor * seq / c.max_position_embeddings - (s.factor - 1), dim / (dim - 2.0));
  }
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, half, opts) * 2.0 / dim);
  switch (s.type) {
    case RopeScalingType::kLinear: return {inv_freq / s.factor, 1.0};
    case RopeScalingType::kYarn: return Yarn(s, inv_freq, dim, theta);
    case RopeScalingType::kLlama3: return {Llama3(s, inv_freq), 1.0};
    case RopeScalingType::kNone:
    case RopeScalingType::kDynamic: break;
  }
  return {inv_freq, 1.0};
}

}  // namespace

at::Tensor ApplyRotary(const at::Tensor& x, const MoeConfig& config) {
  const int64_t seq = x.size(2), dim = x.size(3), half = dim / 2;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const auto [inv_freq, magnitude] = RotaryFrequencies(config, seq, dim);
  const at::Tensor freqs = at::outer(at::arange(seq, opts), inv_freq);  // [S, half]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                  // [S, dim]
  // cos then sin, each cast on its own: the op order of recordings made before rope scaling.
  const double scale = magnitude;  // a structured binding cannot be captured in C++17
  auto scaled = [&](const at::Tensor& t) { return (scale != 1.0 ? t * scale : t).to(x.scalar_type()); };
  const at::Tensor cos = scaled(emb.cos());
  const at::Tensor sin = scaled(emb.sin());
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

double AttentionDivisor(const MoeConfig& c) {
  const int64_t qk_dims = c.IsMla() ? c.qk_nope_head_dim + c.qk_rope_head_dim : c.head_dim;
  double divisor = std::sqrt(static_cast<double>(qk_dims));
  const RopeScaling& s = c.rope_scaling;
  // HF DeepseekV3Attention: under any rope type but the default, not only yarn.
  if (c.family == Family::kDeepseekV3 && s.type != RopeScalingType::kNone && s.mscale_all_dim != 0) {
    const double m = YarnMscale(s.factor, s.mscale_all_dim);
    divisor /= m * m;
  }
  return divisor;
}

at::Tensor HiddenKeys(int64_t seq, int64_t window) {
  const at::Tensor ones = at::ones({seq, seq}, at::TensorOptions().dtype(at::kBool));
  const at::Tensor future = ones.triu(1);
  // Key j is window or more positions before query i when j <= i - window.
  return window > 0 ? future.logical_or(ones.tril(-window)) : future;
}

AttentionImpl::AttentionImpl(const MoeConfig& config, std::string path, int64_t window)
    : config_(config), path_(std::move(path)), window_(window) {
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
  q = ApplyRotary(q, config_);
  k = ApplyRotary(k, config_);
  const int64_t groups = config_.num_heads / config_.num_kv_heads;
  if (groups > 1) {
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / AttentionDivisor(config_);
  scores = Boundary(scores).masked_fill(HiddenKeys(s, window_), -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  const at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape({b, s, config_.num_heads * d});
  return Boundary(o_proj_(Boundary(out)));
}

at::Tensor ExpertImpl::Activate(const at::Tensor& gate) const {
  switch (act_) {
    case Activation::kSilu: return at::silu(gate);
    case Activation::kGelu: return at::gelu(gate);
    case Activation::kGeluTanh: return at::gelu(gate, "tanh");
  }
  return at::silu(gate);
}

ExpertImpl::ExpertImpl(int64_t hidden, int64_t intermediate, bool mixtral_names, std::string path, Activation act)
    : path_(std::move(path)), act_(act) {
  auto linear = [](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
  gate_ = register_module(mixtral_names ? "w1" : "gate_proj", linear(hidden, intermediate));
  up_ = register_module(mixtral_names ? "w3" : "up_proj", linear(hidden, intermediate));
  down_ = register_module(mixtral_names ? "w2" : "down_proj", linear(intermediate, hidden));
}

at::Tensor ExpertImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  // One expression, as before hidden_act: the order of the gate and up ops in a trace stays.
  const at::Tensor act = ExpertActivationRange(Boundary(Activate(Boundary(gate_(x))) * Boundary(up_(x))));
  return Boundary(down_(act));
}

}  // namespace moerr::moe
