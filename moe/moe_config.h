// MoeConfig: the shape of the reference MoE transformer, with the router
// variants of the model families moerr loads (Qwen2-MoE, Qwen3-MoE,
// DeepSeek-V3, Mixtral). Field names follow HF config.json where one exists.
// Attention is Llama-style GQA, or in DeepSeek-V3 multi-head latent
// attention (MLA, kv_lora_rank > 0; latent_attention.h); either may slide a
// window over the keys. The MoE block and parameter names follow each family.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "support/check.h"

namespace moerr::moe {

enum class Family { kQwen2Moe, kQwen3Moe, kDeepseekV3, kMixtral };
std::string FamilyName(Family f);  // the HF model_type: "qwen2_moe", ...
absl::StatusOr<Family> ParseFamily(const std::string& model_type);

enum class RouterKind {
  kSoftmaxTopK,         // softmax over experts, top-k (Mixtral, Qwen)
  kSigmoidGroupedTopK,  // sigmoid scores + correction bias, grouped top-k (DeepSeek-V3)
};

// The MLP activation, `hidden_act` in config.json: silu ("silu", "swish"),
// exact gelu ("gelu"), and gelu's tanh approximation ("gelu_new",
// "gelu_pytorch_tanh", "gelu_fast").
enum class Activation { kSilu, kGelu, kGeluTanh };

// `rope_scaling` in config.json (inv_freq_i = theta^(-2i/head_dim) before scaling):
//   linear:  inv_freq / factor;
//   dynamic: theta * (factor * S / max_position_embeddings - (factor - 1))^(d / (d - 2))
//            for a sequence of S > max_position_embeddings tokens (NTK);
//   yarn:    inv_freq blended between inv_freq / factor and inv_freq by a
//            ramp over the dims between the beta_fast and beta_slow
//            correction dims at original_max_position_embeddings (rounded
//            outwards unless truncate is false); cos and sin times
//            attention_factor, by default mscale(factor, mscale) /
//            mscale(factor, mscale_all_dim) when both are set and non-zero,
//            else mscale(factor, 1); mscale(s, m) = 0.1 m ln s + 1 (1 for s <= 1);
//   llama3:  Llama 3.1's: a wavelength 2 pi / inv_freq longer than
//            original_max_position_embeddings / low_freq_factor divided by
//            factor, one shorter than original / high_freq_factor kept, the
//            ones between blended by (original / wavelength - low) / (high - low).
// transformers' formulas (modeling_rope_utils). DeepSeek-V3 (HF
// DeepseekV3Attention): under any of these types with mscale_all_dim set,
// the attention scale also times mscale(factor, mscale_all_dim)^2.
enum class RopeScalingType { kNone, kLinear, kDynamic, kYarn, kLlama3 };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // yarn, llama3
  double beta_fast = 32.0, beta_slow = 1.0;      // yarn
  double mscale = 0.0;                           // yarn; 0 = not set
  double mscale_all_dim = 0.0;                   // yarn; DeepSeek-V3's attention scale under any type; 0 = not set
  double attention_factor = 0.0;                 // yarn: on cos and sin; 0 = derived from the mscales
  bool truncate = true;                          // yarn: round the correction dims outwards
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
};

struct MoeConfig {
  Family family = Family::kQwen3Moe;
  int64_t vocab_size = 16;
  int64_t hidden_size = 32;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;  // GQA: must divide num_heads
  int64_t head_dim = 8;
  int64_t intermediate_size = 64;      // dense MLP width (first_k_dense layers)
  int64_t moe_intermediate_size = 16;  // per routed expert
  int64_t num_experts = 8;
  int64_t top_k = 2;                   // must be <= num_experts
  bool norm_topk_prob = true;          // renormalise the top-k weights to sum 1
  RouterKind router = RouterKind::kSoftmaxTopK;
  int64_t n_group = 1;                 // DeepSeek grouped top-k: groups of experts,
  int64_t topk_group = 1;              // of which this many are eligible per token
  double routed_scaling_factor = 1.0;  // multiplies the routed output weights
  // Shared experts: Qwen2-MoE has one `shared_expert` of this width with a
  // sigmoid `shared_expert_gate`; DeepSeek-V3 has `shared_experts` of width
  // num_shared_experts * moe_intermediate_size. 0 = none.
  int64_t num_shared_experts = 0;
  int64_t shared_expert_intermediate_size = 0;
  int64_t first_k_dense = 0;  // the first k layers use a dense MLP
  // Of the layers past first_k_dense, the MoE ones are every moe_layer_freq-th
  // from layer 0 (DeepSeek: layer % freq == 0) or, in Qwen, every
  // decoder_sparse_step-th counted from 1 ((layer + 1) % step == 0); the rest are dense.
  int64_t moe_layer_freq = 1;
  int64_t decoder_sparse_step = 1;
  Activation hidden_act = Activation::kSilu;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 4096;  // dynamic rope scaling's threshold
  bool attention_bias = false;  // q/k/v biases (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k (Qwen3)
  // DeepSeek-V3's multi-head latent attention, used when kv_lora_rank > 0
  // (HF DeepseekV3Attention): q from hidden (q_lora_rank 0, config.json's
  // null: q_proj) or
  // through a q_lora_rank bottleneck with its RMSNorm; keys and values from
  // a kv_lora_rank latent (RMSNorm, then per head qk_nope_head_dim + v_head_dim)
  // plus one qk_rope_head_dim rotary key shared by every head. A head's q.k
  // spans qk_nope_head_dim + qk_rope_head_dim dims; head_dim is then
  // qk_rope_head_dim (the rotary dims, as HF sets it) and num_kv_heads unused.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // MLA: the rotary dims of q and k are stored as interleaved pairs
  // (x0, y0, x1, y1, ...) and regrouped into halves before rotating.
  bool rope_interleave = false;
  // Sliding-window attention: 0 = off; else a query at position i sees the
  // keys at i - sliding_window < j <= i (itself and sliding_window - 1 back),
  // in the layers marked in sliding_layers (empty: every layer; else one
  // entry per layer).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double router_aux_loss_coef = 0.01;

  bool IsMoeLayer(int64_t layer) const {
    return layer >= first_k_dense && layer % moe_layer_freq == 0 && (layer + 1) % decoder_sparse_step == 0;
  }
  // True when the MoE layers are exactly first_k_dense .. num_layers - 1.
  bool MoeLayersAreASuffix() const { return moe_layer_freq == 1 && decoder_sparse_step == 1; }
  bool IsMla() const { return kv_lora_rank > 0; }
  // The window of `layer`'s attention in tokens; 0 = full causal attention.
  int64_t WindowOf(int64_t layer) const {
    MOERR_CHECK(sliding_layers.empty() || (layer >= 0 && layer < static_cast<int64_t>(sliding_layers.size())))
        << "layer " << layer << " of " << sliding_layers.size() << " sliding_layers";
    if (sliding_window <= 0) return 0;
    return sliding_layers.empty() || sliding_layers[layer] ? sliding_window : 0;
  }
  // The module name of a layer's MLP block: "mlp", or "block_sparse_moe" (Mixtral).
  std::string MlpName() const { return family == Family::kMixtral ? "block_sparse_moe" : "mlp"; }
};

// Checks the invariants written on the fields.
absl::Status Validate(const MoeConfig& c);

// A preset by name, in the family's shape: its router, attention details and
// shared experts. The presets are the rows of one table (preset_table.cpp),
// each with a one-line description; an unknown name is an error listing them.
absl::StatusOr<MoeConfig> Preset(const std::string& name, Family family = Family::kQwen3Moe);
// The presets' names, in the table's order: "tiny", "tiny-fine", ...
std::vector<std::string> PresetNames();
// One line per preset, its name and description, for help text.
std::string PresetHelp();

// HF config.json, in each family's own keys.
llvm::json::Object ToHfConfig(const MoeConfig& c);
// Strict: every key must be in the family's table (config_keys.h); a key
// moerr does not implement that would change the forward pass is an error
// naming it and its value.
absl::StatusOr<MoeConfig> FromHfConfig(const llvm::json::Object& json);

}  // namespace moerr::moe
