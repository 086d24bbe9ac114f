#include "moe/moe_transformer.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/init.h>

#include "moe/numerics.h"

namespace moerr::moe {

DecoderLayerImpl::DecoderLayerImpl(const MoeConfig& config, int64_t layer)
    : path_("model.layers." + std::to_string(layer)) {
  input_layernorm_ = register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  const int64_t window = config.WindowOf(layer);
  if (config.IsMla()) {
    latent_attn_ = register_module("self_attn", LatentAttention(config, path_ + ".self_attn", window));
  } else {
    self_attn_ = register_module("self_attn", Attention(config, path_ + ".self_attn", window));
  }
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  const std::string mlp = config.MlpName();
  if (config.IsMoeLayer(layer)) {
    moe_ = register_module(mlp, MoeLayer(config, layer, path_ + "." + mlp));
  } else {
    dense_ = register_module(
        mlp, Expert(config.hidden_size, config.intermediate_size, false, path_ + "." + mlp, config.hidden_act));
  }
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  const at::Tensor normed_in = input_layernorm_(x);
  const at::Tensor h = x + (latent_attn_ ? latent_attn_(normed_in) : self_attn_(normed_in));
  const at::Tensor normed = post_attention_layernorm_(h);
  return Boundary(h + (moe_ ? moe_(normed) : dense_(normed)));
}

MoeModelImpl::MoeModelImpl(const MoeConfig& config) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  torch::nn::init::normal_(embed_tokens->weight, 0.0, 0.02);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t l = 0; l < config.num_layers; ++l) layers->push_back(DecoderLayer(config, l));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

MoeTransformerImpl::MoeTransformerImpl(const MoeConfig& config) : config_(config) {
  model_ = register_module("model", MoeModel(config));
  if (!config.tie_word_embeddings) {
    lm_head_ = register_module("lm_head",
                               torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
  // Small init everywhere, as HF does (initializer_range 0.02).
  for (auto& p : named_parameters()) {
    if (p.key().find("norm") == std::string::npos && p.value().dim() == 2) torch::nn::init::normal_(p.value(), 0.0, 0.02);
  }
}

ForwardOutput MoeTransformerImpl::Forward(const at::Tensor& tokens, bool keep_hidden) {
  ForwardOutput out;
  at::Tensor h;
  {
    RECORD_USER_SCOPE("model.embed_tokens");
    h = Boundary(model_->embed_tokens(tokens));
  }
  for (const auto& layer : *model_->layers) {
    h = layer->as<DecoderLayer>()->forward(h);
    if (keep_hidden) out.hidden.push_back(h);
  }
  h = model_->norm(h);
  RECORD_USER_SCOPE("lm_head");
  const at::Tensor logits = lm_head_ ? lm_head_(h) : at::linear(h, model_->embed_tokens->weight);
  out.logits = Boundary(logits).to(at::kFloat);
  return out;
}

at::Tensor MoeTransformerImpl::forward(const at::Tensor& tokens) { return Forward(tokens, false).logits; }

std::vector<MoeLayer> MoeTransformerImpl::MoeLayers() const {
  std::vector<MoeLayer> out;
  for (const auto& layer : *model_->layers) {
    if (MoeLayer m = layer->as<DecoderLayer>()->moe()) out.push_back(m);
  }
  return out;
}

at::Tensor MoeTransformerImpl::AuxLoss() const {
  at::Tensor total = at::zeros({}, at::kFloat);
  for (const MoeLayer& m : MoeLayers()) {
    if (m->aux_loss().defined()) total = total + m->aux_loss();
  }
  return total;
}

void MoeTransformerImpl::SetRoutingObserver(recorder::RoutingObserver* observer) {
  for (MoeLayer& m : MoeLayers()) m->gate()->set_observer(observer);
}

void MoeTransformerImpl::SetParallel(Parallel* parallel) {
  for (MoeLayer& m : MoeLayers()) m->set_parallel(parallel);
}

void MoeTransformerImpl::SetRoutingSource(recorder::RoutingSource* source) {
  for (MoeLayer& m : MoeLayers()) m->gate()->set_source(source);
}

std::vector<std::pair<std::string, at::Tensor>> MoeTransformerImpl::NamedTensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

MoeTransformer CopyOf(const MoeTransformer& model) {
  MoeTransformer copy(model->config());
  torch::NoGradGuard no_grad;
  const auto from = model->NamedTensors();
  const auto to = copy->NamedTensors();
  for (size_t i = 0; i < from.size(); ++i) to[i].second.copy_(from[i].second);
  return copy;
}

}  // namespace moerr::moe
