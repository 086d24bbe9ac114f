#include "moe/moe_config.h"

#include "absl/strings/str_format.h"
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

absl::Status Validate(const MoeConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("model config: " + what); };
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

absl::StatusOr<MoeConfig> Preset(const std::string& name, Family family) {
  MoeConfig c;
  c.family = family;
  if (name == "tiny") {
    c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8;
    c.intermediate_size = 64, c.moe_intermediate_size = 16, c.num_experts = 8, c.top_k = 2;
  } else if (name == "small") {
    c.hidden_size = 96, c.num_layers = 4, c.num_heads = 6, c.num_kv_heads = 2, c.head_dim = 16;
    c.intermediate_size = 192, c.moe_intermediate_size = 48, c.num_experts = 32, c.top_k = 4;
    c.num_shared_experts = 1, c.shared_expert_intermediate_size = 96;
  } else if (name == "wide") {
    c.hidden_size = 128, c.num_layers = 4, c.num_heads = 8, c.num_kv_heads = 4, c.head_dim = 16;
    c.intermediate_size = 256, c.moe_intermediate_size = 32, c.num_experts = 128, c.top_k = 8;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat("unknown preset \"%s\" (tiny, small, wide)", name));
  }
  switch (family) {
    case Family::kQwen2Moe:
      c.attention_bias = true;
      if (c.num_shared_experts == 0) c.num_shared_experts = 1, c.shared_expert_intermediate_size = 2 * c.moe_intermediate_size;
      break;
    case Family::kQwen3Moe:
      c.qk_norm = true;
      c.num_shared_experts = 0, c.shared_expert_intermediate_size = 0;  // Qwen3-MoE has none
      break;
    case Family::kDeepseekV3:
      c.router = RouterKind::kSigmoidGroupedTopK;
      c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
      c.num_shared_experts = 1, c.shared_expert_intermediate_size = 0;
      c.first_k_dense = 1;
      break;
    case Family::kMixtral:
      c.num_shared_experts = 0, c.shared_expert_intermediate_size = 0;
      break;
  }
  MOERR_RETURN_IF_ERROR(Validate(c));
  return c;
}

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
                       {"rms_norm_eps", c.rms_norm_eps},
                       {"tie_word_embeddings", c.tie_word_embeddings},
                       {"hidden_act", "silu"}};
  switch (c.family) {
    case Family::kQwen2Moe:
    case Family::kQwen3Moe:
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["intermediate_size"] = c.intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      j["decoder_sparse_step"] = 1;
      {
        llvm::json::Array dense;
        for (int64_t l = 0; l < c.first_k_dense; ++l) dense.push_back(l);
        j["mlp_only_layers"] = std::move(dense);
      }
      if (c.family == Family::kQwen2Moe) {
        j["shared_expert_intermediate_size"] = c.num_shared_experts ? c.shared_expert_intermediate_size : 0;
        j["qkv_bias"] = c.attention_bias;
      }
      break;
    case Family::kDeepseekV3:
      j["n_routed_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["intermediate_size"] = c.intermediate_size;
      j["n_shared_experts"] = c.num_shared_experts;
      j["first_k_dense_replace"] = c.first_k_dense;
      j["n_group"] = c.n_group;
      j["topk_group"] = c.topk_group;
      j["routed_scaling_factor"] = c.routed_scaling_factor;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["scoring_func"] = c.router == RouterKind::kSigmoidGroupedTopK ? "sigmoid" : "softmax";
      j["topk_method"] = "noaux_tc";
      j["aux_loss_alpha"] = c.router_aux_loss_coef;
      break;
    case Family::kMixtral:
      j["num_local_experts"] = c.num_experts;
      j["intermediate_size"] = c.moe_intermediate_size;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      break;
  }
  return j;
}

namespace {

// Reads a required integer/number/bool field, naming it when absent.
absl::StatusOr<int64_t> Int(const llvm::json::Object& j, const char* key) {
  if (auto v = j.getInteger(key)) return *v;
  return absl::InvalidArgumentError(absl::StrFormat("config.json: \"%s\" is missing or not an integer", key));
}

}  // namespace

absl::StatusOr<MoeConfig> FromHfConfig(const llvm::json::Object& j) {
  MoeConfig c;
  auto type = j.getString("model_type");
  if (!type) return absl::InvalidArgumentError("config.json: no model_type");
  auto family = ParseFamily(type->str());
  if (!family.ok()) return Annotate(family.status(), "config.json");
  c.family = *family;
  MOERR_ASSIGN_OR_RETURN(c.vocab_size, Int(j, "vocab_size"));
  MOERR_ASSIGN_OR_RETURN(c.hidden_size, Int(j, "hidden_size"));
  MOERR_ASSIGN_OR_RETURN(c.num_layers, Int(j, "num_hidden_layers"));
  MOERR_ASSIGN_OR_RETURN(c.num_heads, Int(j, "num_attention_heads"));
  c.num_kv_heads = j.getInteger("num_key_value_heads").getValueOr(c.num_heads);
  c.head_dim = j.getInteger("head_dim").getValueOr(c.hidden_size / std::max<int64_t>(1, c.num_heads));
  MOERR_ASSIGN_OR_RETURN(c.top_k, Int(j, "num_experts_per_tok"));
  c.rope_theta = j.getNumber("rope_theta").getValueOr(10000.0);
  c.rms_norm_eps = j.getNumber("rms_norm_eps").getValueOr(1e-6);
  c.tie_word_embeddings = j.getBoolean("tie_word_embeddings").getValueOr(false);
  switch (c.family) {
    case Family::kQwen2Moe:
    case Family::kQwen3Moe: {
      MOERR_ASSIGN_OR_RETURN(c.num_experts, Int(j, "num_experts"));
      MOERR_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "moe_intermediate_size"));
      c.intermediate_size = j.getInteger("intermediate_size").getValueOr(c.moe_intermediate_size);
      c.norm_topk_prob = j.getBoolean("norm_topk_prob").getValueOr(false);
      c.router_aux_loss_coef = j.getNumber("router_aux_loss_coef").getValueOr(0.001);
      if (j.getInteger("decoder_sparse_step").getValueOr(1) != 1) {
        return absl::InvalidArgumentError("config.json: decoder_sparse_step other than 1 is not supported");
      }
      // mlp_only_layers must be a prefix 0..k-1: dense layers come first here.
      if (const auto* dense = j.getArray("mlp_only_layers")) {
        for (size_t i = 0; i < dense->size(); ++i) {
          if ((*dense)[i].getAsInteger() != static_cast<int64_t>(i)) {
            return absl::InvalidArgumentError("config.json: mlp_only_layers must be 0, 1, ..., k-1");
          }
        }
        c.first_k_dense = dense->size();
      }
      if (c.family == Family::kQwen2Moe) {
        c.shared_expert_intermediate_size = j.getInteger("shared_expert_intermediate_size").getValueOr(0);
        c.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
        c.attention_bias = j.getBoolean("qkv_bias").getValueOr(true);
      } else {
        c.qk_norm = true;
      }
      break;
    }
    case Family::kDeepseekV3: {
      MOERR_ASSIGN_OR_RETURN(c.num_experts, Int(j, "n_routed_experts"));
      MOERR_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "moe_intermediate_size"));
      MOERR_ASSIGN_OR_RETURN(c.intermediate_size, Int(j, "intermediate_size"));
      c.num_shared_experts = j.getInteger("n_shared_experts").getValueOr(0);
      c.first_k_dense = j.getInteger("first_k_dense_replace").getValueOr(0);
      c.n_group = j.getInteger("n_group").getValueOr(1);
      c.topk_group = j.getInteger("topk_group").getValueOr(1);
      c.routed_scaling_factor = j.getNumber("routed_scaling_factor").getValueOr(1.0);
      c.norm_topk_prob = j.getBoolean("norm_topk_prob").getValueOr(true);
      c.router = j.getString("scoring_func").getValueOr("sigmoid") == "sigmoid" ? RouterKind::kSigmoidGroupedTopK
                                                                                : RouterKind::kSoftmaxTopK;
      c.router_aux_loss_coef = j.getNumber("aux_loss_alpha").getValueOr(0.0);
      break;
    }
    case Family::kMixtral: {
      MOERR_ASSIGN_OR_RETURN(c.num_experts, Int(j, "num_local_experts"));
      MOERR_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "intermediate_size"));
      c.intermediate_size = c.moe_intermediate_size;
      c.norm_topk_prob = true;  // Mixtral renormalises over the top-k
      c.router_aux_loss_coef = j.getNumber("router_aux_loss_coef").getValueOr(0.02);
      break;
    }
  }
  MOERR_RETURN_IF_ERROR(Validate(c));
  return c;
}

}  // namespace moerr::moe
