#include "moe/config_keys.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "llvm/Support/FormatVariadic.h"

namespace moerr::moe {
namespace {

// Families a row applies to, as a bit mask.
constexpr unsigned kQ2 = 1, kQ3 = 2, kDs = 4, kMx = 8, kQwen = kQ2 | kQ3, kAll = 15;

unsigned Bit(Family f) {
  switch (f) {
    case Family::kQwen2Moe: return kQ2;
    case Family::kQwen3Moe: return kQ3;
    case Family::kDeepseekV3: return kDs;
    case Family::kMixtral: return kMx;
  }
  return 0;
}

// When a refused key's value leaves the forward pass unchanged.
enum class Harmless {
  kNever,           // present at all: refused
  kOff,             // null, false, 0, "", [] or {}
  kOffOrWindowOff,  // off, or Qwen's use_sliding_window is not true
  kFullAttention,   // layer_types: every entry "full_attention"
};

struct Row {
  const char* name;
  unsigned families;
  KeyUse use;
  Harmless harmless;
  const char* what;
};

constexpr KeyUse kImpl = KeyUse::kImplemented, kRefuse = KeyUse::kRefused, kMeta = KeyUse::kMetadata;
constexpr Harmless kNa = Harmless::kNever;

// The one table. Implemented keys are read in moe_config.cpp (FromHfConfig).
constexpr Row kRows[] = {
    // The shape and the numerics every family shares.
    {"model_type", kAll, kImpl, kNa, ""},
    {"vocab_size", kAll, kImpl, kNa, ""},
    {"hidden_size", kAll, kImpl, kNa, ""},
    {"num_hidden_layers", kAll, kImpl, kNa, ""},
    {"num_attention_heads", kAll, kImpl, kNa, ""},
    {"num_key_value_heads", kAll, kImpl, kNa, ""},
    {"head_dim", kAll, kImpl, kNa, ""},
    {"intermediate_size", kAll, kImpl, kNa, ""},
    {"num_experts_per_tok", kAll, kImpl, kNa, ""},
    {"hidden_act", kAll, kImpl, kNa, ""},
    {"rms_norm_eps", kAll, kImpl, kNa, ""},
    {"rope_theta", kAll, kImpl, kNa, ""},
    {"rope_scaling", kAll, kImpl, kNa, ""},
    {"rope_parameters", kAll, kImpl, kNa, ""},
    {"max_position_embeddings", kAll, kImpl, kNa, ""},
    {"tie_word_embeddings", kAll, kImpl, kNa, ""},
    // Qwen2-MoE and Qwen3-MoE.
    {"num_experts", kQwen, kImpl, kNa, ""},
    {"num_local_experts", kQ3, kImpl, kNa, ""},  // transformers 5 writes Qwen3-MoE's num_experts under this name
    {"moe_intermediate_size", kQwen | kDs, kImpl, kNa, ""},
    {"norm_topk_prob", kQwen | kDs, kImpl, kNa, ""},
    {"decoder_sparse_step", kQwen, kImpl, kNa, ""},
    {"mlp_only_layers", kQwen, kImpl, kNa, ""},
    {"router_aux_loss_coef", kQwen | kMx, kImpl, kNa, ""},
    {"shared_expert_intermediate_size", kQ2, kImpl, kNa, ""},
    {"qkv_bias", kQ2, kImpl, kNa, ""},
    {"use_sliding_window", kQwen, kImpl, kNa, ""},
    {"sliding_window", kQwen, kImpl, kNa, ""},
    {"max_window_layers", kQ2, kImpl, kNa, ""},
    {"layer_types", kQ2, kImpl, kNa, ""},
    {"max_window_layers", kQ3, kRefuse, Harmless::kOffOrWindowOff,
     "a window in some layers only (transformers slides Qwen3-MoE's in every layer, or in those from max_window_layers on)"},
    {"layer_types", kQ3, kRefuse, Harmless::kFullAttention, "attention other than full attention"},
    {"attention_bias", kQ3 | kDs, kRefuse, Harmless::kOff, "attention projection biases in this family"},
    // DeepSeek-V3.
    {"n_routed_experts", kDs, kImpl, kNa, ""},
    {"n_shared_experts", kDs, kImpl, kNa, ""},
    {"first_k_dense_replace", kDs, kImpl, kNa, ""},
    {"moe_layer_freq", kDs, kImpl, kNa, ""},
    {"n_group", kDs, kImpl, kNa, ""},
    {"topk_group", kDs, kImpl, kNa, ""},
    {"routed_scaling_factor", kDs, kImpl, kNa, ""},
    {"scoring_func", kDs, kImpl, kNa, ""},
    {"topk_method", kDs, kImpl, kNa, ""},
    {"aux_loss_alpha", kDs, kImpl, kNa, ""},
    {"seq_aux", kDs, kMeta, kNa, ""},  // a training-loss variant, not the forward
    {"q_lora_rank", kDs, kImpl, kNa, ""},
    {"kv_lora_rank", kDs, kImpl, kNa, ""},
    {"qk_nope_head_dim", kDs, kImpl, kNa, ""},
    {"qk_rope_head_dim", kDs, kImpl, kNa, ""},
    {"v_head_dim", kDs, kImpl, kNa, ""},
    {"qk_head_dim", kDs, kImpl, kNa, ""},  // transformers 5 writes qk_nope_head_dim + qk_rope_head_dim
    {"rope_interleave", kDs, kImpl, kNa, ""},
    {"num_nextn_predict_layers", kDs, kMeta, kNa, ""},  // the MTP head, outside the main forward
    {"ep_size", kDs, kMeta, kNa, ""},
    // Mixtral.
    {"num_local_experts", kMx, kImpl, kNa, ""},
    {"sliding_window", kMx, kImpl, kNa, ""},
    {"router_jitter_noise", kMx, kRefuse, Harmless::kOff, "router jitter noise"},
    // Every family: what changes the forward and moerr lacks.
    {"attention_dropout", kAll, kRefuse, Harmless::kOff, "attention dropout"},
    {"quantization_config", kAll, kRefuse, Harmless::kOff, "quantized weights"},
    // Every family: metadata.
    {"architectures", kAll, kMeta, kNa, ""},
    {"torch_dtype", kAll, kMeta, kNa, ""},
    {"dtype", kAll, kMeta, kNa, ""},
    {"transformers_version", kAll, kMeta, kNa, ""},
    {"_name_or_path", kAll, kMeta, kNa, ""},
    {"auto_map", kAll, kMeta, kNa, ""},
    {"bos_token_id", kAll, kMeta, kNa, ""},
    {"eos_token_id", kAll, kMeta, kNa, ""},
    {"pad_token_id", kAll, kMeta, kNa, ""},
    {"tokenizer_class", kAll, kMeta, kNa, ""},
    {"use_cache", kAll, kMeta, kNa, ""},
    {"initializer_range", kAll, kMeta, kNa, ""},
    {"output_router_logits", kAll, kMeta, kNa, ""},
    {"output_attentions", kAll, kMeta, kNa, ""},
    {"output_hidden_states", kAll, kMeta, kNa, ""},
    {"return_dict", kAll, kMeta, kNa, ""},
    {"id2label", kAll, kMeta, kNa, ""},
    {"label2id", kAll, kMeta, kNa, ""},
    {"pretraining_tp", kAll, kMeta, kNa, ""},  // slices the projections; the same product
};

bool IsOff(const llvm::json::Value& v) {
  if (v.getAsNull()) return true;
  if (auto b = v.getAsBoolean()) return !*b;
  if (auto n = v.getAsNumber()) return *n == 0;
  if (auto s = v.getAsString()) return s->empty();
  if (const auto* a = v.getAsArray()) return a->empty();
  if (const auto* o = v.getAsObject()) return o->empty();
  return false;
}

bool IsHarmless(const Row& row, const llvm::json::Value& v, const llvm::json::Object& config) {
  if (row.harmless != Harmless::kNever && v.getAsNull()) return true;
  switch (row.harmless) {
    case Harmless::kNever: return false;
    case Harmless::kOff: return IsOff(v);
    case Harmless::kOffOrWindowOff: return IsOff(v) || !config.getBoolean("use_sliding_window").getValueOr(false);
    case Harmless::kFullAttention: {
      const auto* a = v.getAsArray();
      if (a == nullptr) return false;
      return std::all_of(a->begin(), a->end(),
                         [](const llvm::json::Value& t) { return t.getAsString().getValueOr("") == "full_attention"; });
    }
  }
  return false;
}

// The value as compact JSON, cut at 80 characters.
std::string Shown(const llvm::json::Value& v) {
  std::string text = llvm::formatv("{0}", v).str();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

const Row* Find(const std::string& key, Family family) {
  for (const Row& row : kRows) {
    if ((row.families & Bit(family)) && key == row.name) return &row;
  }
  return nullptr;
}

}  // namespace

std::vector<ConfigKey> KnownConfigKeys(Family family) {
  std::vector<ConfigKey> out;
  for (const Row& row : kRows) {
    if (row.families & Bit(family)) out.push_back(ConfigKey{row.name, row.use, row.what});
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> CheckConfigKeys(const llvm::json::Object& json, Family family) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : json) keys.push_back(key.str());
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> metadata, problems;
  for (const std::string& key : keys) {
    const llvm::json::Value& value = *json.get(key);
    const Row* row = Find(key, family);
    if (row == nullptr) {
      problems.push_back(absl::StrFormat(
          "unknown key \"%s\": %s (not in moerr's table for %s, so moerr cannot tell whether it changes the forward pass)",
          key, Shown(value), FamilyName(family)));
    } else if (row->use == KeyUse::kMetadata) {
      metadata.push_back(key);
    } else if (row->use == KeyUse::kRefused && !IsHarmless(*row, value, json)) {
      problems.push_back(absl::StrFormat("\"%s\": %s changes the forward pass and moerr does not implement %s", key,
                                         Shown(value), row->what));
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("config.json (%s): %s", FamilyName(family), absl::StrJoin(problems, "; ")));
  }
  return metadata;
}

}  // namespace moerr::moe
