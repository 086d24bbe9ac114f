// The reference decoder-only MoE transformer. Parameter names are the HF
// names of the configured family (named_parameters() gives
// "model.layers.0.mlp.experts.3.gate_proj.weight", ...), so checkpoints map
// one to one.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include "moe/latent_attention.h"
#include "moe/layers.h"
#include "moe/moe_layer.h"

namespace moerr::moe {

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const MoeConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x);

  MoeLayer moe() const { return moe_; }  // null in a dense layer

 private:
  std::string path_;
  RMSNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  Attention self_attn_{nullptr};  // "self_attn": GQA, or else
  LatentAttention latent_attn_{nullptr};  // MLA (config.IsMla())
  MoeLayer moe_{nullptr};
  Expert dense_{nullptr};
};
TORCH_MODULE(DecoderLayer);

// "model": embeddings, layers, final norm.
class MoeModelImpl : public torch::nn::Module {
 public:
  explicit MoeModelImpl(const MoeConfig& config);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers;
  RMSNorm norm{nullptr};
};
TORCH_MODULE(MoeModel);

struct ForwardOutput {
  at::Tensor logits;                // [B, S, vocab] fp32
  std::vector<at::Tensor> hidden;   // per layer output [B, S, hidden], when asked
};

class MoeTransformerImpl : public torch::nn::Module {
 public:
  explicit MoeTransformerImpl(const MoeConfig& config);

  at::Tensor forward(const at::Tensor& tokens);  // [B, S] int64 -> logits [B, S, vocab] fp32
  ForwardOutput Forward(const at::Tensor& tokens, bool keep_hidden);

  const MoeConfig& config() const { return config_; }
  std::vector<MoeLayer> MoeLayers() const;
  // Sum of the MoE layers' load-balancing losses of the last forward.
  at::Tensor AuxLoss() const;
  void SetRoutingObserver(recorder::RoutingObserver* observer);
  void SetRoutingSource(recorder::RoutingSource* source);  // null: route live
  // Expert parallelism for every MoE layer (MoeLayerImpl::set_parallel); null: none.
  void SetParallel(Parallel* parallel);
  // Parameters and buffers by HF name, in registration order.
  std::vector<std::pair<std::string, at::Tensor>> NamedTensors() const;

 private:
  MoeConfig config_;
  MoeModel model_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(MoeTransformer);

// A new model of `model`'s config holding a copy of its parameters and buffers.
MoeTransformer CopyOf(const MoeTransformer& model);

}  // namespace moerr::moe
