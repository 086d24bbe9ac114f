// Strict configs: every refused key errors with its name and value, unknown
// keys error, metadata is listed; and each implemented key changes the
// logits as a plain-ATen forward written from the published formulas
// (hf_reference_forward.h: HF's modeling code, DeepSeek-V3's yarn) says. That reference reads the
// raw config.json and the checkpoint's tensors by name; it shares no code
// with moe/ (the test uses moe/ only to name and shape random weights).
#include "moe/config_keys.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "formats/hf_checkpoint.h"
#include "formats/json_file.h"
#include "llvm/Support/FormatVariadic.h"
#include "moe/checkpoint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/moe/hf_reference_forward.h"
#include "tests/testing/test_util.h"

namespace moerr::moe {
namespace {

using formats::testing::TempDir;
using llvm::json::Object;
using Tensors = std::map<std::string, at::Tensor>;
using reference::Reference;

Object BaseConfig(Family f) { return ToHfConfig(Preset("tiny", f).value()); }

std::string Message(const Object& config) {
  auto c = FromHfConfig(config);
  return c.ok() ? "ok" : std::string(c.status().message());
}

// A value that turns each refused key on.
llvm::json::Value EnablingValue(const std::string& key) {
  if (key == "layer_types") return llvm::json::Array{"sliding_attention", "full_attention"};
  if (key == "quantization_config") return Object{{"quant_method", "fp8"}};
  if (key == "attention_bias") return true;
  return 7;
}

TEST(ConfigKeysTest, EveryRefusedKeyErrorsWithItsNameAndValue) {
  for (Family f : {Family::kQwen2Moe, Family::kQwen3Moe, Family::kDeepseekV3, Family::kMixtral}) {
    int refused = 0;
    for (const ConfigKey& key : KnownConfigKeys(f)) {
      if (key.use != KeyUse::kRefused) continue;
      ++refused;
      Object config = BaseConfig(f);
      // The harmless spelling loads: null leaves the forward unchanged.
      config[key.name] = nullptr;
      EXPECT_EQ(Message(config), "ok") << key.name;
      config[key.name] = EnablingValue(key.name);
      if ((key.name == "sliding_window" || key.name == "max_window_layers") && f != Family::kMixtral) {
        config["use_sliding_window"] = true;
      }
      const std::string shown = llvm::formatv("\"{0}\": {1}", key.name, config[key.name]).str();
      const std::string msg = Message(config);
      EXPECT_NE(msg.find(shown + " changes the forward pass"), std::string::npos) << shown << " -> " << msg;
      EXPECT_NE(msg.find(key.what), std::string::npos) << msg;
    }
    EXPECT_GE(refused, 2) << FamilyName(f);
  }
  // A window configured but not enabled is harmless (Qwen's published configs).
  for (Family f : {Family::kQwen2Moe, Family::kQwen3Moe}) {
    Object qwen = BaseConfig(f);
    qwen["use_sliding_window"] = false, qwen["sliding_window"] = 4096, qwen["max_window_layers"] = 28;
    EXPECT_EQ(Message(qwen), "ok");
    auto c = FromHfConfig(qwen);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->WindowOf(0), 0);
  }
}

TEST(ConfigKeysTest, BadAttentionValuesAreErrorsNamingTheKey) {
  const std::vector<std::pair<Family, Object>> bad = {
      {Family::kDeepseekV3, Object{{"q_lora_rank", 8}}},  // no kv_lora_rank: no MLA
      {Family::kDeepseekV3, Object{{"kv_lora_rank", -2}}},
      {Family::kDeepseekV3, Object{{"kv_lora_rank", 8}, {"qk_rope_head_dim", 4}, {"q_lora_rank", "x"}}},
      {Family::kQwen2Moe, Object{{"use_sliding_window", true}, {"sliding_window", 0}}},
      {Family::kQwen2Moe, Object{{"use_sliding_window", true}, {"layer_types", llvm::json::Array{"full_attention"}}}},
      {Family::kQwen2Moe, Object{{"layer_types", llvm::json::Array{"sliding_attention", "full_attention"}}}},
      {Family::kMixtral, Object{{"sliding_window", -1}}},
  };
  for (const auto& [family, changes] : bad) {
    Object c = BaseConfig(family);
    for (const auto& [k, v] : changes) c[k] = v;
    const std::string msg = Message(c);
    EXPECT_NE(msg, "ok") << llvm::formatv("{0}", llvm::json::Value(Object(changes))).str();
    bool named = false;
    for (const auto& kv : changes) named = named || msg.find(kv.first.str()) != std::string::npos;
    EXPECT_TRUE(named) << msg;
  }
  // HF's MLA needs one key per head.
  Object mla = BaseConfig(Family::kDeepseekV3);
  mla["kv_lora_rank"] = 8, mla["qk_rope_head_dim"] = 4, mla["num_key_value_heads"] = 2;
  EXPECT_NE(Message(mla).find("num_key_value_heads"), std::string::npos) << Message(mla);

  // Each: the family, the keys set, the key the error must show with its value, and why.
  struct Named {
    Family family;
    Object changes;
    std::string key, why;
  };
  const Object latent{{"kv_lora_rank", 8}, {"qk_rope_head_dim", 4}, {"num_key_value_heads", 4}};
  auto with = [](Object o, const Object& more) {
    for (const auto& [k, v] : more) o[k] = v;
    return o;
  };
  const std::vector<Named> named = {
      // A layer count is read before any per-layer key is laid out.
      {Family::kQwen2Moe, Object{{"num_hidden_layers", -1}, {"use_sliding_window", true}}, "num_hidden_layers", "must be in"},
      {Family::kQwen2Moe, Object{{"num_hidden_layers", 4000000000}, {"use_sliding_window", true}}, "num_hidden_layers", "must be in"},
      {Family::kQwen3Moe, Object{{"num_hidden_layers", 0}}, "num_hidden_layers", "must be in"},
      // A wrong JSON type is an error, not the default.
      {Family::kDeepseekV3, Object{{"kv_lora_rank", "512"}}, "kv_lora_rank", "must be an integer"},
      {Family::kDeepseekV3, Object{{"kv_lora_rank", true}}, "kv_lora_rank", "must be an integer"},
      {Family::kDeepseekV3, with(latent, Object{{"qk_nope_head_dim", 8.5}}), "qk_nope_head_dim", "must be an integer"},
      {Family::kDeepseekV3, with(latent, Object{{"qk_rope_head_dim", "4"}}), "qk_rope_head_dim", "must be an integer"},
      {Family::kDeepseekV3, with(latent, Object{{"v_head_dim", true}}), "v_head_dim", "must be an integer"},
      {Family::kDeepseekV3, with(latent, Object{{"rope_interleave", "true"}}), "rope_interleave", "must be a boolean"},
      {Family::kDeepseekV3, with(latent, Object{{"rope_interleave", 1}}), "rope_interleave", "must be a boolean"},
      {Family::kQwen2Moe, Object{{"use_sliding_window", true}, {"sliding_window", 2}, {"max_window_layers", "2"}},
       "max_window_layers", "must be an integer"},
      {Family::kQwen2Moe, Object{{"use_sliding_window", "true"}}, "use_sliding_window", "must be a boolean"},
      // HF: only null is a plain q_proj; Mixtral: only null is no window.
      {Family::kDeepseekV3, with(latent, Object{{"q_lora_rank", 0}}), "q_lora_rank", "positive integer or null"},
      {Family::kMixtral, Object{{"sliding_window", 0}}, "sliding_window", "positive integer or null"},
      // Not an array, with the window off as on.
      {Family::kQwen2Moe, Object{{"layer_types", "sliding_attention"}}, "layer_types", "one type per layer"},
      {Family::kQwen2Moe, Object{{"layer_types", "full_attention"}, {"use_sliding_window", true}}, "layer_types",
       "one type per layer"},
      // transformers 5's derived keys must agree with what they derive from.
      {Family::kDeepseekV3, with(latent, Object{{"qk_nope_head_dim", 6}, {"qk_head_dim", 12}}), "qk_head_dim",
       "must be qk_nope_head_dim + qk_rope_head_dim (6 + 4)"},
      {Family::kQwen3Moe, Object{{"num_local_experts", 4}}, "num_experts", "disagrees with num_local_experts (4)"},
      {Family::kQwen2Moe,
       Object{{"rope_scaling", Object{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                      {"high_freq_factor", 1.0}}}},
       "rope_scaling", "high_freq_factor > low_freq_factor"},
  };
  for (const Named& n : named) {
    Object c = BaseConfig(n.family);
    for (const auto& [k, v] : n.changes) c[k] = v;
    const std::string shown = llvm::formatv("\"{0}\": {1}", n.key, c[n.key]).str();
    const std::string msg = Message(c);
    EXPECT_NE(msg.find(shown), std::string::npos) << shown << " -> " << msg;
    EXPECT_NE(msg.find(n.why), std::string::npos) << shown << " -> " << msg;
  }
  // A rope parameter's error names it inside its object.
  Object truncate = BaseConfig(Family::kMixtral);
  truncate["rope_scaling"] = Object{{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", "no"}};
  EXPECT_NE(Message(truncate).find("\"rope_scaling.truncate\": \"no\" must be a boolean"), std::string::npos)
      << Message(truncate);
  // An odd rope width names qk_rope_head_dim, the key the config sets.
  Object odd = with(BaseConfig(Family::kDeepseekV3), with(latent, Object{{"qk_rope_head_dim", 5}}));
  EXPECT_NE(Message(odd).find("qk_rope_head_dim (5) must be even"), std::string::npos) << Message(odd);
  // MLA keys without kv_lora_rank: the message shows their values.
  MoeConfig gqa = Preset("tiny", Family::kDeepseekV3).value();
  gqa.q_lora_rank = 16;
  const std::string why(Validate(gqa).message());
  EXPECT_NE(why.find("q_lora_rank (16) and rope_interleave (false)"), std::string::npos) << why;
  EXPECT_NE(why.find("here 0"), std::string::npos) << why;
}

// moerr's own config.json of an MLA model and of a windowed one read back the same.
TEST(ConfigKeysTest, AttentionConfigsRoundTrip) {
  MoeConfig mla = Preset("tiny", Family::kDeepseekV3).value();
  mla.num_kv_heads = mla.num_heads, mla.kv_lora_rank = 8, mla.q_lora_rank = 0;
  mla.qk_nope_head_dim = 6, mla.qk_rope_head_dim = mla.head_dim = 4, mla.v_head_dim = 5;
  ASSERT_TRUE(Validate(mla).ok()) << Validate(mla);
  MoeConfig qwen2 = Preset("tiny", Family::kQwen2Moe).value();
  qwen2.sliding_window = 3, qwen2.sliding_layers = {false, true};
  MoeConfig mixtral = Preset("tiny", Family::kMixtral).value();
  mixtral.sliding_window = 5;
  for (const MoeConfig& c : {mla, Preset("tiny-mla", Family::kDeepseekV3).value(), qwen2, mixtral}) {
    auto back = FromHfConfig(ToHfConfig(c));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(llvm::json::Value(ToHfConfig(*back)), llvm::json::Value(ToHfConfig(c)));
    EXPECT_EQ(back->q_lora_rank, c.q_lora_rank);
    EXPECT_EQ(back->kv_lora_rank, c.kv_lora_rank);
    EXPECT_EQ(back->v_head_dim, c.v_head_dim);
    for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(back->WindowOf(l), c.WindowOf(l)) << l;
  }
}

TEST(ConfigKeysTest, UnknownKeysAndUnimplementedValuesAreErrorsMetadataIsListed) {
  Object c = BaseConfig(Family::kQwen3Moe);
  c["attention_sink_size"] = 4;
  EXPECT_NE(Message(c).find("unknown key \"attention_sink_size\": 4"), std::string::npos) << Message(c);
  // A key of another family is unknown here.
  c = BaseConfig(Family::kMixtral);
  c["n_group"] = 8;
  EXPECT_NE(Message(c).find("unknown key \"n_group\""), std::string::npos) << Message(c);

  const std::vector<std::pair<std::string, llvm::json::Value>> bad = {
      {"hidden_act", "relu"},
      {"rope_scaling", Object{{"rope_type", "llama3"}, {"factor", 8.0}}},
      {"rope_scaling", Object{{"rope_type", "longrope"}, {"factor", 4.0}}},
      {"mlp_only_layers", llvm::json::Array{1}},
      {"rope_scaling", Object{{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}},
  };
  for (const auto& [key, value] : bad) {
    c = BaseConfig(Family::kQwen3Moe);
    c[key] = value;
    EXPECT_NE(Message(c).find("\"" + key), std::string::npos) << key << " -> " << Message(c);
  }
  c = BaseConfig(Family::kQwen3Moe);
  c["rope_scaling"] = Object{{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", true}};
  EXPECT_EQ(Message(c), "ok");
  c = BaseConfig(Family::kDeepseekV3);
  c["topk_method"] = "group_limited_greedy";
  EXPECT_NE(Message(c).find("\"topk_method\": \"group_limited_greedy\""), std::string::npos) << Message(c);

  c = BaseConfig(Family::kQwen2Moe);
  c["torch_dtype"] = "bfloat16", c["architectures"] = llvm::json::Array{"Qwen2MoeForCausalLM"}, c["eos_token_id"] = 2;
  auto metadata = CheckConfigKeys(c, Family::kQwen2Moe);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(*metadata, (std::vector<std::string>{"architectures", "eos_token_id", "torch_dtype"}));
  EXPECT_EQ(Message(c), "ok");
}

// DeepSeek-V3's published config.json (deepseek-ai/DeepSeek-V3, as
// DeepSeek-R1 ships it): every key is known; its fp8 quantization_config is
// refused by name, and without it the config reads as MLA with its ranks
// and HF's default interleaved rope dims.
TEST(ConfigKeysTest, DeepseekV3PublishedConfigReadsAsLatentAttention) {
  auto parsed = llvm::json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.46.3",
    "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
  ASSERT_TRUE(static_cast<bool>(parsed)) << llvm::toString(parsed.takeError());
  Object config = *parsed->getAsObject();
  EXPECT_NE(Message(config).find("\"quantization_config\""), std::string::npos) << Message(config);
  config.erase("quantization_config");
  auto c = FromHfConfig(config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsMla());
  EXPECT_EQ(c->q_lora_rank, 1536);
  EXPECT_EQ(c->kv_lora_rank, 512);
  EXPECT_EQ(c->qk_nope_head_dim, 128);
  EXPECT_EQ(c->qk_rope_head_dim, 64);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->v_head_dim, 128);
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_EQ(c->WindowOf(60), 0);
}

// A layer of the tiny-mla preset holds HF DeepseekV3Attention's parameters,
// by name and shape, as a checkpoint's "model.layers.L." tensors load.
TEST(ConfigKeysTest, LatentAttentionHasHfParameterNames) {
  EXPECT_FALSE(Preset("tiny-mla", Family::kQwen3Moe).ok());
  const MoeConfig c = Preset("tiny-mla", Family::kDeepseekV3).value();
  DecoderLayer layer(c, 1);
  std::vector<std::pair<std::string, std::vector<int64_t>>> attention;
  for (const auto& p : layer->named_parameters()) {
    if (p.key().rfind("self_attn.", 0) == 0) attention.emplace_back(p.key(), p.value().sizes().vec());
  }
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"self_attn.q_a_proj.weight", {16, 32}},          {"self_attn.q_a_layernorm.weight", {16}},
      {"self_attn.q_b_proj.weight", {4 * (8 + 4), 16}}, {"self_attn.kv_a_proj_with_mqa.weight", {8 + 4, 32}},
      {"self_attn.kv_a_layernorm.weight", {8}},         {"self_attn.kv_b_proj.weight", {4 * (8 + 8), 8}},
      {"self_attn.o_proj.weight", {32, 4 * 8}}};
  EXPECT_EQ(attention, expected);
  const at::Tensor out = layer->forward(at::randn({2, 5, 32}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 5, 32}));
  EXPECT_TRUE(out.isfinite().all().item<bool>());
}

// Writes a checkpoint of `config` with random weights of visible size (the
// names and shapes from moe/'s model of that config) and returns its dir.
std::string WriteCheckpoint(const TempDir& dir, const std::string& name, const Object& config) {
  torch::manual_seed(7);
  MoeTransformer model(FromHfConfig(config).value());
  {
    torch::NoGradGuard no_grad;
    for (auto& [n, t] : model->NamedTensors()) {
      if (n.find("norm") != std::string::npos) {
        t.copy_(1 + 0.3 * at::randn_like(t));
      } else if (t.dim() == 2) {
        t.copy_(at::randn_like(t) / std::sqrt(static_cast<double>(t.size(1))));
      } else if (n.find("e_score_correction_bias") != std::string::npos) {
        // Non-negative, so choice = sigmoid + bias > 0 and masking the
        // groups left out with 0 (HF) or -inf (moerr) picks the same experts.
        t.copy_(0.5 * at::randn_like(t).abs());
      } else {
        t.copy_(0.5 * at::randn_like(t));  // q/k/v biases
      }
    }
  }
  const std::string path = dir.File(name);
  EXPECT_TRUE(SaveCheckpoint(model, path, false).ok());
  EXPECT_TRUE(formats::WriteJsonFile(path + "/config.json", Object(config), /*overwrite=*/true).ok());
  return path;
}

// A DeepSeek-V3 checkpoint of MLA weights under a config.json without
// kv_lora_rank: the error names the missing key, not every tensor.
TEST(ConfigKeysTest, LatentWeightsWithoutKvLoraRankNameTheKey) {
  TempDir dir;
  Object config = BaseConfig(Family::kDeepseekV3);
  for (const auto& [k, v] : Object{{"q_lora_rank", 12}, {"kv_lora_rank", 8}, {"qk_nope_head_dim", 6},
                                   {"qk_rope_head_dim", 4}, {"v_head_dim", 5}, {"num_key_value_heads", 4}}) {
    config[k] = v;
  }
  const std::string path = WriteCheckpoint(dir, "mla", config);
  for (const char* key : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                          "rope_interleave"}) {
    config.erase(key);
  }
  config["head_dim"] = 4;
  ASSERT_TRUE(FromHfConfig(config).ok()) << FromHfConfig(config).status();
  ASSERT_TRUE(formats::WriteJsonFile(path + "/config.json", Object(config), /*overwrite=*/true).ok());
  auto model = LoadCheckpoint(path);
  ASSERT_FALSE(model.ok());
  const std::string msg(model.status().message());
  EXPECT_NE(msg.find("config.json lacks kv_lora_rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kv_a_proj_with_mqa"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

struct KeyCase {
  std::string name;
  Family family;
  Object changes;
  bool same_weights;  // the weights of the base config fit: the key alone must move the logits
};

class ImplementedKeyTest : public ::testing::TestWithParam<KeyCase> {};

TEST_P(ImplementedKeyTest, LogitsFollowTheReferenceFormula) {
  const KeyCase& kc = GetParam();
  TempDir dir;
  const Object base = BaseConfig(kc.family);
  Object config = base;
  for (const auto& [k, v] : kc.changes) config[k] = v;
  const std::string path = WriteCheckpoint(dir, "ckpt", config);

  auto model = LoadCheckpoint(path);
  ASSERT_TRUE(model.ok()) << model.status();
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 16, {2, 9}, at::kLong);
  const at::Tensor logits = (*model)->forward(tokens);

  auto raw = formats::LoadHfCheckpoint(path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  Tensors weights;
  for (const auto& [n, v] : raw->tensors) weights[n] = recorder::ToTensor(v).to(at::kFloat);
  const at::Tensor expected = Reference{raw->config, weights}.Forward(tokens);
  const double err = (logits - expected).abs().max().item<double>();
  EXPECT_LT(err, 2e-4) << kc.name << ": moerr vs the reference formula, max abs error " << err;

  if (kc.same_weights) {
    MoeTransformer plain(FromHfConfig(base).value());
    ASSERT_TRUE(LoadWeights(plain, raw->tensors).ok());
    const double moved = (plain->forward(tokens) - logits).abs().max().item<double>();
    EXPECT_GT(moved, 1e-3) << kc.name << " did not change the logits";
  }
}

Object Yarn(double factor, int64_t original, double mscale_all_dim) {
  return Object{{"type", "yarn"},     {"factor", factor},        {"original_max_position_embeddings", original},
                {"beta_fast", 32.0}, {"beta_slow", 1.0},        {"mscale", 1.0},
                {"mscale_all_dim", mscale_all_dim}};
}

// DeepSeek-V3 MLA keys (4 heads, each its own key) plus `more`; q_lora_rank nullopt: absent.
Object Mla(std::optional<llvm::json::Value> q_lora_rank, Object more) {
  Object o{{"kv_lora_rank", 8}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4}, {"v_head_dim", 5},
           {"num_key_value_heads", 4}};
  if (q_lora_rank) o["q_lora_rank"] = std::move(*q_lora_rank);
  for (auto& [k, v] : more) o[k] = v;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Keys, ImplementedKeyTest,
    ::testing::Values(
        KeyCase{"qwen3_base", Family::kQwen3Moe, {}, false},
        KeyCase{"qwen2_base_qkv_bias", Family::kQwen2Moe, {}, false},
        KeyCase{"qwen2_no_qkv_bias", Family::kQwen2Moe, Object{{"qkv_bias", false}}, false},
        KeyCase{"deepseek_base", Family::kDeepseekV3, {}, false},
        KeyCase{"mixtral_base", Family::kMixtral, {}, false},
        KeyCase{"hidden_act_gelu", Family::kQwen3Moe, Object{{"hidden_act", "gelu"}}, true},
        KeyCase{"hidden_act_gelu_tanh", Family::kDeepseekV3, Object{{"hidden_act", "gelu_pytorch_tanh"}}, true},
        KeyCase{"hidden_act_gelu_new", Family::kMixtral, Object{{"hidden_act", "gelu_new"}}, true},
        KeyCase{"rope_linear", Family::kQwen3Moe, Object{{"rope_scaling", Object{{"type", "linear"}, {"factor", 4.0}}}}, true},
        KeyCase{"rope_dynamic",
                Family::kMixtral,
                Object{{"rope_scaling", Object{{"rope_type", "dynamic"}, {"factor", 3.0}}}, {"max_position_embeddings", 4}},
                true},
        KeyCase{"rope_yarn_qwen", Family::kQwen3Moe, Object{{"rope_scaling", Yarn(8.0, 1024, 0.0)}}, true},
        KeyCase{"rope_yarn_deepseek", Family::kDeepseekV3, Object{{"rope_scaling", Yarn(40.0, 1024, 1.0)}}, true},
        // yarn's magnitude on cos and sin, as transformers sets it: mscale
        // alone or mscale_all_dim alone leave mscale(factor, 1); an explicit
        // attention_factor; the correction range not rounded.
        KeyCase{"rope_yarn_mscale_alone", Family::kMixtral,
                Object{{"rope_scaling", Object{{"type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 4},
                                               {"mscale", 0.5}}}},
                true},
        KeyCase{"rope_yarn_attention_factor_untruncated", Family::kQwen3Moe,
                Object{{"rope_scaling", Object{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4},
                                               {"attention_factor", 1.3}, {"truncate", false}}}},
                true},
        KeyCase{"rope_llama3", Family::kQwen2Moe,
                Object{{"rope_scaling", Object{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}}}},
                true},
        KeyCase{"qwen3_num_local_experts", Family::kQwen3Moe, Object{{"num_local_experts", 8}}, false},
        KeyCase{"mla_qk_head_dim", Family::kDeepseekV3, Mla(12, Object{{"qk_head_dim", 10}}), false},
        KeyCase{"norm_topk_prob_off", Family::kQwen2Moe, Object{{"norm_topk_prob", false}}, true},
        KeyCase{"routed_scaling_factor", Family::kDeepseekV3, Object{{"routed_scaling_factor", 1.0}}, true},
        KeyCase{"first_k_dense_replace_0", Family::kDeepseekV3, Object{{"first_k_dense_replace", 0}}, false},
        KeyCase{"moe_layer_freq_2", Family::kDeepseekV3, Object{{"first_k_dense_replace", 0}, {"moe_layer_freq", 2}}, false},
        KeyCase{"decoder_sparse_step_2", Family::kQwen3Moe, Object{{"decoder_sparse_step", 2}}, false},
        KeyCase{"mlp_only_layers_0", Family::kQwen2Moe, Object{{"mlp_only_layers", llvm::json::Array{0}}}, false},
        // Multi-head latent attention: with a q bottleneck and HF's default
        // interleaved rope dims (and an rms_norm_eps the latent norms, at
        // 1e-6, must not take), with a plain q_proj, with q_lora_rank absent
        // (HF's 1536), under yarn, and under linear rope with mscale_all_dim
        // (HF scales the attention by mscale^2 under any rope_scaling).
        KeyCase{"mla_q_lora", Family::kDeepseekV3, Mla(12, Object{{"rms_norm_eps", 1e-2}}), false},
        KeyCase{"mla_no_q_lora", Family::kDeepseekV3, Mla(nullptr, Object{{"rope_interleave", false}}), false},
        KeyCase{"mla_q_lora_absent", Family::kDeepseekV3, Mla(std::nullopt, Object{}), false},
        KeyCase{"mla_yarn", Family::kDeepseekV3, Mla(12, Object{{"rope_scaling", Yarn(40.0, 1024, 1.0)}}), false},
        KeyCase{"mla_linear_mscale_all_dim", Family::kDeepseekV3,
                Mla(12, Object{{"rope_scaling", Object{{"type", "linear"}, {"factor", 4.0}, {"mscale_all_dim", 1.0}}}}),
                false},
        // Sliding windows shorter than the 9 tokens: each must move the logits.
        KeyCase{"window_qwen2_max_window_layers", Family::kQwen2Moe,
                Object{{"use_sliding_window", true}, {"sliding_window", 3}, {"max_window_layers", 2}}, true},
        KeyCase{"window_qwen2_layer_types", Family::kQwen2Moe,
                Object{{"use_sliding_window", true},
                       {"sliding_window", 4},
                       {"layer_types", llvm::json::Array{"full_attention", "sliding_attention"}}},
                true},
        KeyCase{"window_qwen3", Family::kQwen3Moe, Object{{"use_sliding_window", true}, {"sliding_window", 3}}, true},
        KeyCase{"window_mixtral", Family::kMixtral, Object{{"sliding_window", 4}}, true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moerr::moe
