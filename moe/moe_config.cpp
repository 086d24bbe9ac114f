#include "moe/moe_config.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "llvm/Support/FormatVariadic.h"
#include "moe/config_keys.h"
#include "support/enum_table.h"
#include "support/status.h"

namespace moerr::moe {

namespace {

// The names are HF config.json `model_type` values.
constexpr EnumName<Family> kFamilies[] = {{Family::kQwen2Moe, "qwen2_moe"},
                                          {Family::kQwen3Moe, "qwen3_moe"},
                                          {Family::kDeepseekV3, "deepseek_v3"},
                                          {Family::kMixtral, "mixtral"}};

}  // namespace

std::string FamilyName(Family f) { return std::string(EnumNameOf(kFamilies, f)); }

absl::StatusOr<Family> ParseFamily(const std::string& model_type) {
  return ParseEnum(kFamilies, "model_type", model_type);
}

namespace {

// Multi-head latent attention and the sliding window.
absl::Status ValidateAttention(const MoeConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("model config: " + what); };
  if (c.IsMla()) {
    if (c.family != Family::kDeepseekV3) return bad("multi-head latent attention (kv_lora_rank > 0) is DeepSeek-V3's");
    if (c.q_lora_rank < 0 || c.qk_nope_head_dim < 0 || c.qk_rope_head_dim <= 0 || c.v_head_dim <= 0) {
      return bad(absl::StrFormat("MLA needs q_lora_rank >= 0 (%d), qk_nope_head_dim >= 0 (%d), qk_rope_head_dim > 0 "
                                 "(%d) and v_head_dim > 0 (%d)",
                                 c.q_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim));
    }
    if (c.num_kv_heads != c.num_heads) {
      return bad(absl::StrFormat("an MLA model's num_key_value_heads (%d) must equal num_attention_heads (%d): every "
                                 "head has its own key",
                                 c.num_kv_heads, c.num_heads));
    }
    if (c.qk_rope_head_dim % 2 != 0) {
      return bad(absl::StrFormat("qk_rope_head_dim (%d) must be even (rotary embeddings)", c.qk_rope_head_dim));
    }
    if (c.head_dim != c.qk_rope_head_dim) {
      return bad(absl::StrFormat("an MLA model's head_dim (%d) is its qk_rope_head_dim (%d)", c.head_dim,
                                 c.qk_rope_head_dim));
    }
  } else if (c.kv_lora_rank < 0 || c.q_lora_rank != 0 || c.rope_interleave) {
    return bad(absl::StrFormat("q_lora_rank (%d) and rope_interleave (%s) need multi-head latent attention "
                               "(kv_lora_rank > 0, here %d)",
                               c.q_lora_rank, c.rope_interleave ? "true" : "false", c.kv_lora_rank));
  }
  if (c.sliding_window < 0) return bad("sliding_window must be >= 0");
  if (c.sliding_window > 0 && c.family == Family::kDeepseekV3) return bad("DeepSeek-V3 has no sliding window");
  if (!c.sliding_layers.empty() && static_cast<int64_t>(c.sliding_layers.size()) != c.num_layers) {
    return bad(absl::StrFormat("sliding_layers has %d entries for %d layers", c.sliding_layers.size(), c.num_layers));
  }
  if (!c.sliding_layers.empty() && c.family != Family::kQwen2Moe) {
    return bad("only Qwen2-MoE slides the window in some layers (Qwen3-MoE and Mixtral: every layer)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const MoeConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("model config: " + what); };
  // First: an MLA model's head_dim is its qk_rope_head_dim, which the errors there name.
  MOERR_RETURN_IF_ERROR(ValidateAttention(c));
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.num_layers <= 0 || c.head_dim <= 0) {
    return bad("vocab_size, hidden_size, num_layers and head_dim must be > 0");
  }
  if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return bad(absl::StrFormat("num_kv_heads (%d) must divide num_heads (%d)", c.num_kv_heads, c.num_heads));
  }
  if (c.head_dim % 2 != 0) return bad("head_dim must be even (rotary embeddings)");
  if (c.num_experts <= 0 || c.top_k <= 0 || c.top_k > c.num_experts) {
    return bad(absl::StrFormat("top_k (%d) must be in [1, num_experts = %d]", c.top_k, c.num_experts));
  }
  if (c.n_group <= 0 || c.num_experts % c.n_group != 0 || c.topk_group <= 0 || c.topk_group > c.n_group) {
    return bad(absl::StrFormat("n_group (%d) must divide num_experts (%d) and topk_group (%d) be in [1, n_group]",
                               c.n_group, c.num_experts, c.topk_group));
  }
  if (c.router == RouterKind::kSigmoidGroupedTopK && c.top_k > c.topk_group * (c.num_experts / c.n_group)) {
    return bad("top_k exceeds the experts in the eligible groups");
  }
  if (c.first_k_dense < 0 || c.first_k_dense > c.num_layers) return bad("first_k_dense must be in [0, num_layers]");
  if (c.moe_layer_freq < 1 || c.decoder_sparse_step < 1) return bad("moe_layer_freq and decoder_sparse_step must be >= 1");
  if (c.family != Family::kDeepseekV3 && c.moe_layer_freq != 1) return bad("moe_layer_freq is DeepSeek-V3's");
  if (c.family != Family::kQwen2Moe && c.family != Family::kQwen3Moe && c.decoder_sparse_step != 1) {
    return bad("decoder_sparse_step is Qwen's");
  }
  if (c.rope_scaling.type != RopeScalingType::kNone && c.rope_scaling.factor < 1.0) return bad("rope_scaling factor must be >= 1");
  if (c.rope_scaling.type == RopeScalingType::kDynamic && (c.max_position_embeddings <= 0 || c.head_dim <= 2)) {
    return bad("dynamic rope scaling needs max_position_embeddings > 0 and head_dim > 2");
  }
  if ((c.rope_scaling.type == RopeScalingType::kYarn || c.rope_scaling.type == RopeScalingType::kLlama3) &&
      c.rope_scaling.original_max_position_embeddings <= 0) {
    return bad("yarn and llama3 rope scaling need original_max_position_embeddings > 0");
  }
  if (c.rope_scaling.type == RopeScalingType::kLlama3 &&
      !(c.rope_scaling.low_freq_factor > 0 && c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor)) {
    return bad("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor");
  }
  if (c.num_shared_experts < 0) return bad("num_shared_experts must be >= 0");
  if (c.family == Family::kQwen2Moe && c.num_shared_experts > 1) return bad("Qwen2-MoE has at most one shared expert");
  if (c.family == Family::kQwen2Moe && c.num_shared_experts == 1 && c.shared_expert_intermediate_size <= 0) {
    return bad("shared_expert_intermediate_size must be > 0");
  }
  if (c.family == Family::kMixtral && (c.num_shared_experts != 0 || c.first_k_dense != 0)) {
    return bad("Mixtral has no shared experts and no dense layers");
  }
  return absl::OkStatus();
}

namespace {

// hidden_act spellings, HF's names.
constexpr EnumName<Activation> kActivations[] = {{Activation::kSilu, "silu"},
                                                 {Activation::kSilu, "swish"},
                                                 {Activation::kGelu, "gelu"},
                                                 {Activation::kGeluTanh, "gelu_pytorch_tanh"},
                                                 {Activation::kGeluTanh, "gelu_new"},
                                                 {Activation::kGeluTanh, "gelu_fast"}};

constexpr EnumName<RopeScalingType> kRopeTypes[] = {{RopeScalingType::kNone, "default"},
                                                    {RopeScalingType::kLinear, "linear"},
                                                    {RopeScalingType::kDynamic, "dynamic"},
                                                    {RopeScalingType::kYarn, "yarn"},
                                                    {RopeScalingType::kLlama3, "llama3"}};

absl::Status BadKey(const std::string& key, const llvm::json::Value& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrFormat("config.json: \"%s\": %s %s", key, llvm::formatv("{0}", value).str(), why));
}

// The keys of a `rope_scaling` object moerr reads; a key of another type
// than the object's is ignored, as transformers ignores it.
constexpr const char* kRopeKeys[] = {
    "type",           "rope_type", "factor",          "original_max_position_embeddings",
    "beta_fast",      "beta_slow", "mscale",          "mscale_all_dim",
    "attention_factor", "truncate", "low_freq_factor", "high_freq_factor",
    "rope_theta"};

// The parameters of a scaling type past "default", from `whole` (the object of `key`).
absl::Status ReadRopeParameters(const char* key, const llvm::json::Value& whole, MoeConfig& c) {
  RopeScaling& s = c.rope_scaling;
  const llvm::json::Object& r = *whole.getAsObject();
  auto factor = r.getNumber("factor");
  if (!factor || *factor < 1.0) return BadKey(key, whole, "needs a factor >= 1");
  s.factor = *factor;
  s.original_max_position_embeddings =
      r.getInteger("original_max_position_embeddings").getValueOr(c.max_position_embeddings);
  // transformers: `get("beta_fast") or 32`, so 0 is the default too.
  s.beta_fast = r.getNumber("beta_fast").getValueOr(0.0);
  if (s.beta_fast == 0) s.beta_fast = 32.0;
  s.beta_slow = r.getNumber("beta_slow").getValueOr(0.0);
  if (s.beta_slow == 0) s.beta_slow = 1.0;
  s.mscale = r.getNumber("mscale").getValueOr(0.0);
  s.mscale_all_dim = r.getNumber("mscale_all_dim").getValueOr(0.0);
  if (s.type == RopeScalingType::kYarn) {
    const llvm::json::Value* truncate = r.get("truncate");
    if (truncate != nullptr && !truncate->getAsNull() && !truncate->getAsBoolean()) {
      return BadKey(absl::StrCat(key, ".truncate"), *truncate, "must be a boolean");
    }
    s.truncate = truncate == nullptr || truncate->getAsNull() ? true : *truncate->getAsBoolean();
    // null or absent: derived from the mscales (0 here); a value must be a positive number.
    const llvm::json::Value* attention = r.get("attention_factor");
    s.attention_factor = attention == nullptr ? 0.0 : attention->getAsNumber().getValueOr(0.0);
    if (attention != nullptr && !attention->getAsNull() && !(s.attention_factor > 0)) {
      return BadKey(absl::StrCat(key, ".attention_factor"), *attention, "must be a number > 0");
    }
  }
  if (s.type == RopeScalingType::kLlama3) {
    auto low = r.getNumber("low_freq_factor"), high = r.getNumber("high_freq_factor");
    if (!low || !high || *low <= 0 || *high <= *low) {
      return BadKey(key, whole, "needs low_freq_factor > 0 and high_freq_factor > low_freq_factor (llama3)");
    }
    s.low_freq_factor = *low;
    s.high_freq_factor = *high;
  }
  return absl::OkStatus();
}

// `rope_scaling`, or transformers 5's `rope_parameters` (which also holds
// rope_theta), into c.rope_scaling; null or type "default" is no scaling.
absl::Status ReadRope(const llvm::json::Object& j, MoeConfig& c) {
  const char* key = j.get("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const llvm::json::Value* value = j.get(key);
  if (value == nullptr || value->getAsNull()) return absl::OkStatus();
  const llvm::json::Object* r = value->getAsObject();
  if (r == nullptr) return BadKey(key, *value, "is not an object");
  for (const auto& [k, v] : *r) {
    if (std::find(std::begin(kRopeKeys), std::end(kRopeKeys), k.str()) == std::end(kRopeKeys)) {
      return BadKey(absl::StrCat(key, ".", k.str()), v, "changes the forward pass and moerr does not implement it");
    }
  }
  if (auto theta = r->getNumber("rope_theta")) c.rope_theta = *theta;
  auto type = r->getString("rope_type");
  if (!type) type = r->getString("type");
  if (!type) return BadKey(key, *value, "names no rope_type");
  auto parsed = ParseEnum(kRopeTypes, "rope type", type->str());
  if (!parsed.ok()) {
    return BadKey(key, *value,
                  "changes the forward pass and moerr does not implement its type (it implements linear, dynamic, "
                  "yarn, llama3)");
  }
  c.rope_scaling.type = *parsed;
  if (c.rope_scaling.type == RopeScalingType::kNone) return absl::OkStatus();
  return ReadRopeParameters(key, *value, c);
}

llvm::json::Value RopeToJson(const RopeScaling& s) {
  if (s.type == RopeScalingType::kNone) return nullptr;
  llvm::json::Object o{{"type", std::string(EnumNameOf(kRopeTypes, s.type))}, {"factor", s.factor}};
  if (s.type == RopeScalingType::kYarn || s.type == RopeScalingType::kLlama3) {
    o["original_max_position_embeddings"] = s.original_max_position_embeddings;
  }
  if (s.type == RopeScalingType::kYarn) {
    o["beta_fast"] = s.beta_fast;
    o["beta_slow"] = s.beta_slow;
    if (s.mscale != 0) o["mscale"] = s.mscale;
    if (s.attention_factor != 0) o["attention_factor"] = s.attention_factor;
    if (!s.truncate) o["truncate"] = false;
  }
  if (s.type == RopeScalingType::kLlama3) {
    o["low_freq_factor"] = s.low_freq_factor;
    o["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.mscale_all_dim != 0) o["mscale_all_dim"] = s.mscale_all_dim;  // yarn's; DeepSeek-V3's attention scale
  return o;
}

}  // namespace

llvm::json::Object ToHfConfig(const MoeConfig& c) {
  llvm::json::Object j{{"model_type", FamilyName(c.family)},
                       {"vocab_size", c.vocab_size},
                       {"hidden_size", c.hidden_size},
                       {"num_hidden_layers", c.num_layers},
                       {"num_attention_heads", c.num_heads},
                       {"num_key_value_heads", c.num_kv_heads},
                       {"head_dim", c.head_dim},
                       {"num_experts_per_tok", c.top_k},
                       {"rope_theta", c.rope_theta},
                       {"rope_scaling", RopeToJson(c.rope_scaling)},
                       {"max_position_embeddings", c.max_position_embeddings},
                       {"rms_norm_eps", c.rms_norm_eps},
                       {"tie_word_embeddings", c.tie_word_embeddings},
                       {"hidden_act", std::string(EnumNameOf(kActivations, c.hidden_act))}};
  switch (c.family) {
    case Family::kQwen2Moe:
    case Family::kQwen3Moe:
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["intermediate_size"] = c.intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      {
        llvm::json::Array dense;
        for (int64_t l = 0; l < c.first_k_dense; ++l) dense.push_back(l);
        j["mlp_only_layers"] = std::move(dense);
      }
      if (c.family == Family::kQwen2Moe) {
        j["shared_expert_intermediate_size"] = c.num_shared_experts ? c.shared_expert_intermediate_size : 0;
        j["qkv_bias"] = c.attention_bias;
      }
      if (c.sliding_window > 0) {
        j["use_sliding_window"] = true;
        j["sliding_window"] = c.sliding_window;
        if (c.family == Family::kQwen2Moe) {
          llvm::json::Array types;
          for (int64_t l = 0; l < c.num_layers; ++l) types.push_back(c.WindowOf(l) ? "sliding_attention" : "full_attention");
          j["layer_types"] = std::move(types);
        } else {
          j["max_window_layers"] = 0;  // every layer, by either rule transformers has applied to Qwen3-MoE
        }
      }
      break;
    case Family::kDeepseekV3:
      j["n_routed_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["intermediate_size"] = c.intermediate_size;
      j["n_shared_experts"] = c.num_shared_experts;
      j["first_k_dense_replace"] = c.first_k_dense;
      j["moe_layer_freq"] = c.moe_layer_freq;
      j["n_group"] = c.n_group;
      j["topk_group"] = c.topk_group;
      j["routed_scaling_factor"] = c.routed_scaling_factor;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["scoring_func"] = c.router == RouterKind::kSigmoidGroupedTopK ? "sigmoid" : "softmax";
      j["topk_method"] = c.router == RouterKind::kSigmoidGroupedTopK ? "noaux_tc" : "greedy";
      j["aux_loss_alpha"] = c.router_aux_loss_coef;
      if (c.IsMla()) {
        j["q_lora_rank"] = c.q_lora_rank > 0 ? llvm::json::Value(c.q_lora_rank) : llvm::json::Value(nullptr);
        j["kv_lora_rank"] = c.kv_lora_rank;
        j["qk_nope_head_dim"] = c.qk_nope_head_dim;
        j["qk_rope_head_dim"] = c.qk_rope_head_dim;
        j["v_head_dim"] = c.v_head_dim;
        j["rope_interleave"] = c.rope_interleave;
      }
      break;
    case Family::kMixtral:
      j["num_local_experts"] = c.num_experts;
      j["intermediate_size"] = c.moe_intermediate_size;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
      break;
  }
  return j;
}

namespace {

// Reads a required integer field, naming it when absent.
absl::StatusOr<int64_t> Int(const llvm::json::Object& j, const char* key) {
  if (auto v = j.getInteger(key)) return *v;
  return absl::InvalidArgumentError(absl::StrFormat("config.json: \"%s\" is missing or not an integer", key));
}

// An optional integer key: absent or null is `fallback`; another non-integer an error naming it.
absl::StatusOr<int64_t> Int(const llvm::json::Object& j, const char* key, int64_t fallback) {
  const llvm::json::Value* v = j.get(key);
  if (v == nullptr || v->getAsNull()) return fallback;
  if (auto i = v->getAsInteger()) return *i;
  return BadKey(key, *v, "must be an integer");
}

// An optional boolean key: absent or null is `fallback`; another non-boolean an error naming it.
absl::StatusOr<bool> Bool(const llvm::json::Object& j, const char* key, bool fallback) {
  const llvm::json::Value* v = j.get(key);
  if (v == nullptr || v->getAsNull()) return fallback;
  if (auto b = v->getAsBoolean()) return *b;
  return BadKey(key, *v, "must be a boolean");
}

// The most decoder layers a config may have: well past any published model
// (DeepSeek-V3: 61), and small enough that per-layer tables stay small.
constexpr int64_t kMaxLayers = 1 << 14;

// The keys every family reads: shape, attention, numerics, activation, rope.
absl::Status ReadShared(const llvm::json::Object& j, MoeConfig& c) {
  MOERR_ASSIGN_OR_RETURN(c.vocab_size, Int(j, "vocab_size"));
  MOERR_ASSIGN_OR_RETURN(c.hidden_size, Int(j, "hidden_size"));
  MOERR_ASSIGN_OR_RETURN(c.num_layers, Int(j, "num_hidden_layers"));
  if (c.num_layers <= 0 || c.num_layers > kMaxLayers) {
    return BadKey("num_hidden_layers", *j.get("num_hidden_layers"), absl::StrFormat("must be in [1, %d]", kMaxLayers));
  }
  MOERR_ASSIGN_OR_RETURN(c.num_heads, Int(j, "num_attention_heads"));
  c.num_kv_heads = j.getInteger("num_key_value_heads").getValueOr(c.num_heads);
  c.head_dim = j.getInteger("head_dim").getValueOr(c.hidden_size / std::max<int64_t>(1, c.num_heads));
  MOERR_ASSIGN_OR_RETURN(c.top_k, Int(j, "num_experts_per_tok"));
  c.rope_theta = j.getNumber("rope_theta").getValueOr(10000.0);
  c.rms_norm_eps = j.getNumber("rms_norm_eps").getValueOr(1e-6);
  c.tie_word_embeddings = j.getBoolean("tie_word_embeddings").getValueOr(false);
  c.max_position_embeddings = j.getInteger("max_position_embeddings").getValueOr(c.max_position_embeddings);
  if (const llvm::json::Value* act = j.get("hidden_act")) {
    auto name = act->getAsString();
    auto parsed = ParseEnum(kActivations, "hidden_act", name ? name->str() : "");
    if (!name || !parsed.ok()) {
      return BadKey("hidden_act", *act,
                    "changes the forward pass and moerr does not implement it (silu, swish, gelu, gelu_new, "
                    "gelu_pytorch_tanh, gelu_fast)");
    }
    c.hidden_act = *parsed;
  }
  return ReadRope(j, c);
}

// Qwen: a layer is MoE unless listed in mlp_only_layers, and only every
// decoder_sparse_step-th counted from 1. mlp_only_layers must be 0..k-1.
absl::Status ReadQwenLayers(const llvm::json::Object& j, MoeConfig& c) {
  c.decoder_sparse_step = j.getInteger("decoder_sparse_step").getValueOr(1);
  if (c.decoder_sparse_step < 1) return BadKey("decoder_sparse_step", *j.get("decoder_sparse_step"), "must be >= 1");
  if (const llvm::json::Value* v = j.get("mlp_only_layers")) {
    const auto* dense = v->getAsArray();
    if (dense == nullptr) return BadKey("mlp_only_layers", *v, "is not an array");
    for (size_t i = 0; i < dense->size(); ++i) {
      if ((*dense)[i].getAsInteger() != static_cast<int64_t>(i)) {
        return BadKey("mlp_only_layers", *v,
                      "changes the forward pass and moerr does not implement it (dense layers other than the first k: "
                      "it takes 0, 1, ..., k-1)");
      }
    }
    c.first_k_dense = dense->size();
  }
  return absl::OkStatus();
}

// DeepSeek-V3's MLA keys, with HF's defaults for the absent ones; a config
// without kv_lora_rank (or with null or 0) has moerr's GQA attention.
absl::Status ReadLatentAttention(const llvm::json::Object& j, MoeConfig& c) {
  static constexpr const char* kKeys[] = {"q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                          "qk_head_dim", "rope_interleave"};
  MOERR_ASSIGN_OR_RETURN(c.kv_lora_rank, Int(j, "kv_lora_rank", 0));
  if (c.kv_lora_rank <= 0) {
    if (c.kv_lora_rank < 0) {
      return BadKey("kv_lora_rank", *j.get("kv_lora_rank"), "must be a positive integer, or null or 0 for no latent attention");
    }
    c.kv_lora_rank = 0;
    for (const char* key : kKeys) {
      const llvm::json::Value* v = j.get(key);
      if (v != nullptr && !v->getAsNull() && !(key == std::string("rope_interleave") && !v->getAsBoolean().getValueOr(true))) {
        return BadKey(key, *v, "needs multi-head latent attention, and kv_lora_rank is absent, null or 0");
      }
    }
    return absl::OkStatus();
  }
  // q_lora_rank: absent is HF's default 1536; only null is a plain q_proj (0 here).
  const llvm::json::Value* q = j.get("q_lora_rank");
  c.q_lora_rank = q == nullptr ? 1536 : q->getAsNull() ? 0 : q->getAsInteger().getValueOr(0);
  if (c.q_lora_rank <= 0 && q != nullptr && !q->getAsNull()) {
    return BadKey("q_lora_rank", *q, "must be a positive integer or null");
  }
  MOERR_ASSIGN_OR_RETURN(c.qk_nope_head_dim, Int(j, "qk_nope_head_dim", 128));
  MOERR_ASSIGN_OR_RETURN(c.qk_rope_head_dim, Int(j, "qk_rope_head_dim", 64));
  MOERR_ASSIGN_OR_RETURN(c.v_head_dim, Int(j, "v_head_dim", 128));
  MOERR_ASSIGN_OR_RETURN(c.rope_interleave, Bool(j, "rope_interleave", true));
  // transformers 5 writes qk_head_dim, derived from the two: it must be their sum.
  const llvm::json::Value* qk = j.get("qk_head_dim");
  if (qk != nullptr && !qk->getAsNull() && qk->getAsInteger() != c.qk_nope_head_dim + c.qk_rope_head_dim) {
    return BadKey("qk_head_dim", *qk,
                  absl::StrFormat("must be qk_nope_head_dim + qk_rope_head_dim (%d + %d)", c.qk_nope_head_dim,
                                  c.qk_rope_head_dim));
  }
  c.head_dim = c.qk_rope_head_dim;  // as HF's DeepseekV3Config sets it, whatever head_dim says
  return absl::OkStatus();
}

// Qwen's window: on only with use_sliding_window (default size 4096).
// Qwen2-MoE slides in the layers layer_types marks "sliding_attention", by
// default the even layers below max_window_layers (default 28); Qwen3-MoE
// in every layer, and moerr refuses a max_window_layers other than 0 there
// (transformers versions disagree on what it does). transformers 5's rules.
absl::Status ReadQwenWindow(const llvm::json::Object& j, MoeConfig& c) {
  const llvm::json::Value* layer_types = j.get("layer_types");
  const auto* types = layer_types ? layer_types->getAsArray() : nullptr;
  if (layer_types != nullptr && !layer_types->getAsNull() && types == nullptr) {
    return BadKey("layer_types", *layer_types, "must list one type per layer");
  }
  MOERR_ASSIGN_OR_RETURN(const bool use_window, Bool(j, "use_sliding_window", false));
  if (!use_window) {
    c.sliding_window = 0;
    for (size_t l = 0; types && l < types->size(); ++l) {
      if ((*types)[l].getAsString().getValueOr("") != "full_attention") {
        return BadKey("layer_types", *layer_types, "names a window while use_sliding_window is off");
      }
    }
    return absl::OkStatus();
  }
  const llvm::json::Value* w = j.get("sliding_window");
  c.sliding_window = w == nullptr ? 4096 : w->getAsInteger().getValueOr(-1);
  if (c.sliding_window <= 0) return BadKey("sliding_window", *w, "must be a positive integer when use_sliding_window is true");
  if (c.family != Family::kQwen2Moe) return absl::OkStatus();
  c.sliding_layers.assign(c.num_layers, false);
  if (const llvm::json::Value* v = layer_types; types != nullptr) {
    if (static_cast<int64_t>(types->size()) != c.num_layers) {
      return BadKey("layer_types", *v, "must list one type per layer");
    }
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string t = (*types)[l].getAsString().getValueOr("").str();
      if (t != "sliding_attention" && t != "full_attention") {
        return BadKey("layer_types", *v, "changes the forward pass and moerr does not implement it (it implements "
                                         "sliding_attention and full_attention)");
      }
      c.sliding_layers[l] = t == "sliding_attention";
    }
    return absl::OkStatus();
  }
  MOERR_ASSIGN_OR_RETURN(const int64_t max_window_layers, Int(j, "max_window_layers", 28));
  for (int64_t l = 0; l < c.num_layers; ++l) c.sliding_layers[l] = l % 2 == 0 && l < max_window_layers;
  return absl::OkStatus();
}

// Qwen's expert count: num_experts, or in Qwen3-MoE num_local_experts (the
// name transformers 5 writes); both present must agree.
absl::StatusOr<int64_t> QwenExperts(const llvm::json::Object& j, Family family) {
  const bool local = family == Family::kQwen3Moe && j.get("num_local_experts") != nullptr;
  if (!local) return Int(j, "num_experts");
  MOERR_ASSIGN_OR_RETURN(const int64_t n, Int(j, "num_local_experts"));
  if (j.get("num_experts") != nullptr && j.getInteger("num_experts") != n) {
    return BadKey("num_experts", *j.get("num_experts"), absl::StrFormat("disagrees with num_local_experts (%d)", n));
  }
  return n;
}

absl::Status ReadFamily(const llvm::json::Object& j, MoeConfig& c) {
  switch (c.family) {
    case Family::kQwen2Moe:
    case Family::kQwen3Moe: {
      MOERR_ASSIGN_OR_RETURN(c.num_experts, QwenExperts(j, c.family));
      MOERR_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "moe_intermediate_size"));
      c.intermediate_size = j.getInteger("intermediate_size").getValueOr(c.moe_intermediate_size);
      c.norm_topk_prob = j.getBoolean("norm_topk_prob").getValueOr(false);
      c.router_aux_loss_coef = j.getNumber("router_aux_loss_coef").getValueOr(0.001);
      MOERR_RETURN_IF_ERROR(ReadQwenLayers(j, c));
      MOERR_RETURN_IF_ERROR(ReadQwenWindow(j, c));
      if (c.family == Family::kQwen2Moe) {
        c.shared_expert_intermediate_size = j.getInteger("shared_expert_intermediate_size").getValueOr(0);
        c.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
        c.attention_bias = j.getBoolean("qkv_bias").getValueOr(true);
      } else {
        c.qk_norm = true;
      }
      return absl::OkStatus();
    }
    case Family::kDeepseekV3: {
      MOERR_ASSIGN_OR_RETURN(c.num_experts, Int(j, "n_routed_experts"));
      MOERR_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "moe_intermediate_size"));
      MOERR_ASSIGN_OR_RETURN(c.intermediate_size, Int(j, "intermediate_size"));
      c.num_shared_experts = j.getInteger("n_shared_experts").getValueOr(0);
      c.first_k_dense = j.getInteger("first_k_dense_replace").getValueOr(0);
      c.moe_layer_freq = j.getInteger("moe_layer_freq").getValueOr(1);
      if (c.moe_layer_freq < 1) return BadKey("moe_layer_freq", *j.get("moe_layer_freq"), "must be >= 1");
      c.n_group = j.getInteger("n_group").getValueOr(1);
      c.topk_group = j.getInteger("topk_group").getValueOr(1);
      c.routed_scaling_factor = j.getNumber("routed_scaling_factor").getValueOr(1.0);
      c.norm_topk_prob = j.getBoolean("norm_topk_prob").getValueOr(true);
      const std::string scoring = j.getString("scoring_func").getValueOr("sigmoid").str();
      const std::string method = j.getString("topk_method").getValueOr(scoring == "sigmoid" ? "noaux_tc" : "greedy").str();
      // sigmoid + noaux_tc: grouped top-k with the correction bias; softmax + greedy: plain top-k.
      if (scoring == "sigmoid" && method == "noaux_tc") {
        c.router = RouterKind::kSigmoidGroupedTopK;
      } else if (scoring == "softmax" && method == "greedy") {
        c.router = RouterKind::kSoftmaxTopK;
      } else {
        return absl::InvalidArgumentError(absl::StrFormat(
            "config.json: \"scoring_func\": \"%s\" with \"topk_method\": \"%s\" changes the forward pass and moerr does "
            "not implement it (sigmoid with noaux_tc, softmax with greedy)",
            scoring, method));
      }
      c.router_aux_loss_coef = j.getNumber("aux_loss_alpha").getValueOr(0.0);
      return ReadLatentAttention(j, c);
    }
    case Family::kMixtral: {
      MOERR_ASSIGN_OR_RETURN(c.num_experts, Int(j, "num_local_experts"));
      MOERR_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "intermediate_size"));
      c.intermediate_size = c.moe_intermediate_size;
      c.norm_topk_prob = true;  // Mixtral renormalises over the top-k
      c.router_aux_loss_coef = j.getNumber("router_aux_loss_coef").getValueOr(0.02);
      // Mixtral slides the window in every layer; null is full attention.
      if (const llvm::json::Value* w = j.get("sliding_window"); w && !w->getAsNull()) {
        c.sliding_window = w->getAsInteger().getValueOr(0);
        if (c.sliding_window <= 0) return BadKey("sliding_window", *w, "must be a positive integer or null");
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MoeConfig> FromHfConfig(const llvm::json::Object& j) {
  MoeConfig c;
  auto type = j.getString("model_type");
  if (!type) return absl::InvalidArgumentError("config.json: no model_type");
  auto family = ParseFamily(type->str());
  if (!family.ok()) return Annotate(family.status(), "config.json");
  c.family = *family;
  MOERR_RETURN_IF_ERROR(CheckConfigKeys(j, c.family).status());
  MOERR_RETURN_IF_ERROR(ReadShared(j, c));
  MOERR_RETURN_IF_ERROR(ReadFamily(j, c));
  MOERR_RETURN_IF_ERROR(Validate(c));
  return c;
}

}  // namespace moerr::moe
