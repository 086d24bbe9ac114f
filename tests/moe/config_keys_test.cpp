// Strict configs: every refused key errors with its name and value, unknown
// keys error, metadata is listed; and each implemented key changes the
// logits as a plain-ATen forward written here from the published formulas
// (HF's modeling code, DeepSeek-V3's yarn) says. That reference reads the
// raw config.json and the checkpoint's tensors by name; it shares no code
// with moe/ (the test uses moe/ only to name and shape random weights).
#include "moe/config_keys.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "formats/hf_checkpoint.h"
#include "llvm/Support/FormatVariadic.h"
#include "moe/checkpoint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/testing/test_util.h"

namespace moerr::moe {
namespace {

using formats::testing::TempDir;
using llvm::json::Object;
using Tensors = std::map<std::string, at::Tensor>;

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
      {"rope_scaling", Object{{"type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}}},
      {"mlp_only_layers", llvm::json::Array{1}},
      {"rope_scaling", Object{{"type", "yarn"}, {"factor", 4.0}, {"truncate", false}}},
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

// ---- The reference forward, from the published formulas. ----

at::Tensor Rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * (x.pow(2).mean(-1, true) + eps).rsqrt());
}

at::Tensor Act(const std::string& name, const at::Tensor& x) {
  if (name == "silu" || name == "swish") return x * at::sigmoid(x);
  if (name == "gelu") return 0.5 * x * (1 + at::erf(x / std::sqrt(2.0)));
  // gelu_new, gelu_pytorch_tanh, gelu_fast: the tanh approximation.
  return 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}

struct Reference {
  const Object& cfg;
  const Tensors& w;

  const at::Tensor& W(const std::string& name) const {
    auto it = w.find(name);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + name);
    return it->second;
  }
  double Num(const char* key, double fallback) const { return cfg.getNumber(key).getValueOr(fallback); }
  int64_t Int(const char* key, int64_t fallback) const { return cfg.getInteger(key).getValueOr(fallback); }
  std::string Type() const { return cfg.getString("model_type")->str(); }

  at::Tensor Mlp(const std::string& p, const at::Tensor& x) const {
    const std::string act = cfg.getString("hidden_act").getValueOr("silu").str();
    const bool mx = Type() == "mixtral" && p.find(".experts.") != std::string::npos;
    const at::Tensor g = at::matmul(x, W(p + (mx ? ".w1.weight" : ".gate_proj.weight")).t());
    const at::Tensor u = at::matmul(x, W(p + (mx ? ".w3.weight" : ".up_proj.weight")).t());
    return at::matmul(Act(act, g) * u, W(p + (mx ? ".w2.weight" : ".down_proj.weight")).t());
  }

  bool IsMoe(int64_t l) const {
    if (Type() == "deepseek_v3") return l >= Int("first_k_dense_replace", 0) && l % Int("moe_layer_freq", 1) == 0;
    if (Type() == "mixtral") return true;
    if (const auto* dense = cfg.getArray("mlp_only_layers")) {
      for (const auto& d : *dense) {
        if (d.getAsInteger() == l) return false;
      }
    }
    return (l + 1) % Int("decoder_sparse_step", 1) == 0;
  }

  // Dense [T, E] routing weights: each token's top-k experts' weights, 0 elsewhere.
  at::Tensor Routing(const std::string& p, const at::Tensor& x) const {
    const int64_t k = Int("num_experts_per_tok", 0);
    const at::Tensor logits = at::matmul(x, W(p + ".gate.weight").t());
    at::Tensor scores, ids;
    if (Type() == "deepseek_v3") {
      scores = at::sigmoid(logits);
      const at::Tensor choice = scores + W(p + ".gate.e_score_correction_bias");
      const int64_t groups = Int("n_group", 1), per = choice.size(1) / groups;
      const at::Tensor group_score = std::get<0>(choice.view({-1, groups, per}).topk(2, -1)).sum(-1);
      const at::Tensor keep_groups = std::get<1>(group_score.topk(Int("topk_group", 1), -1));
      at::Tensor allowed = at::zeros({choice.size(0), groups}).scatter(1, keep_groups, 1.0);
      allowed = allowed.repeat_interleave(per, 1);
      ids = std::get<1>(at::where(allowed.gt(0), choice, at::full_like(choice, -1e30)).topk(k, -1));
    } else {
      scores = at::softmax(logits, -1);
      ids = std::get<1>(scores.topk(k, -1));
    }
    at::Tensor weights = scores.gather(1, ids);
    const bool norm = Type() == "mixtral" || cfg.getBoolean("norm_topk_prob").getValueOr(Type() == "deepseek_v3");
    if (norm) weights = weights / weights.sum(-1, true);
    if (Type() == "deepseek_v3") weights = weights * Num("routed_scaling_factor", 1.0);
    return at::zeros_like(scores).scatter(1, ids, weights);
  }

  at::Tensor Moe(const std::string& p, const at::Tensor& x) const {
    const at::Tensor route = Routing(p, x);
    at::Tensor out = at::zeros_like(x);
    for (int64_t e = 0; e < route.size(1); ++e) {
      out = out + route.select(1, e).unsqueeze(1) * Mlp(p + ".experts." + std::to_string(e), x);
    }
    if (Type() == "qwen2_moe" && Int("shared_expert_intermediate_size", 0) > 0) {
      out = out + at::sigmoid(at::matmul(x, W(p + ".shared_expert_gate.weight").t())) * Mlp(p + ".shared_expert", x);
    }
    if (Type() == "deepseek_v3" && Int("n_shared_experts", 0) > 0) out = out + Mlp(p + ".shared_experts", x);
    return out;
  }

  // cos and sin [S, head_dim] from the rope formulas, in double.
  std::pair<at::Tensor, at::Tensor> Rope(int64_t seq, int64_t dim) const {
    double base = Num("rope_theta", 10000.0), magnitude = 1.0;
    const Object* rs = cfg.getObject("rope_scaling");
    const std::string type = rs ? rs->getString("type").getValueOr(rs->getString("rope_type").getValueOr("")).str() : "";
    const double factor = rs ? rs->getNumber("factor").getValueOr(1.0) : 1.0;
    const int64_t max_pos = Int("max_position_embeddings", 4096);
    if (type == "dynamic" && seq > max_pos) {
      base *= std::pow(factor * seq / max_pos - (factor - 1), dim / (dim - 2.0));
    }
    std::vector<double> inv(dim / 2);
    for (int64_t i = 0; i < dim / 2; ++i) inv[i] = 1.0 / std::pow(base, 2.0 * i / dim);
    if (type == "linear") {
      for (double& f : inv) f /= factor;
    } else if (type == "yarn") {
      const double orig = rs->getNumber("original_max_position_embeddings").getValueOr(max_pos);
      auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(base)); };
      const double lo = std::max(0.0, std::floor(corr(rs->getNumber("beta_fast").getValueOr(32))));
      double hi = std::min<double>(dim - 1, std::ceil(corr(rs->getNumber("beta_slow").getValueOr(1))));
      if (lo == hi) hi += 0.001;
      for (int64_t i = 0; i < dim / 2; ++i) {
        const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
        inv[i] = inv[i] / factor * ramp + inv[i] * (1 - ramp);
      }
      auto ms = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
      magnitude = ms(rs->getNumber("mscale").getValueOr(1)) / ms(rs->getNumber("mscale_all_dim").getValueOr(0));
    }
    std::vector<float> cos(seq * dim), sin(seq * dim);
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t j = 0; j < dim; ++j) {
        const double angle = s * inv[j % (dim / 2)];
        cos[s * dim + j] = magnitude * std::cos(angle), sin[s * dim + j] = magnitude * std::sin(angle);
      }
    }
    return {at::tensor(cos).view({seq, dim}), at::tensor(sin).view({seq, dim})};
  }

  double SoftmaxScale(int64_t dim) const {
    double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    const Object* rs = cfg.getObject("rope_scaling");
    if (Type() == "deepseek_v3" && rs && rs->getString("type").getValueOr("") == "yarn") {
      const double m = rs->getNumber("mscale_all_dim").getValueOr(0), factor = *rs->getNumber("factor");
      if (m != 0) scale *= std::pow(0.1 * m * std::log(factor) + 1.0, 2);
    }
    return scale;
  }

  // HF's sliding window of layer l in tokens, 0 = full: Mixtral's in every
  // layer; Qwen's only with use_sliding_window (size default 4096), in
  // Qwen3-MoE every layer, in Qwen2-MoE the layers layer_types marks, by
  // default the even ones below max_window_layers (default 28).
  int64_t Window(int64_t l) const {
    if (Type() == "mixtral") return Int("sliding_window", 0);
    if (Type() == "deepseek_v3" || !cfg.getBoolean("use_sliding_window").getValueOr(false)) return 0;
    const int64_t w = Int("sliding_window", 4096);
    if (Type() == "qwen3_moe") return w;
    if (const auto* types = cfg.getArray("layer_types")) return (*types)[l].getAsString().getValueOr("") == "sliding_attention" ? w : 0;
    return l % 2 == 0 && l < Int("max_window_layers", 28) ? w : 0;
  }

  // Additive [S, S] mask: key j is visible to query i when i - window < j <= i.
  static at::Tensor Mask(int64_t s, int64_t window) {
    at::Tensor mask = at::zeros({s, s});
    for (int64_t i = 0; i < s; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        if (j > i || (window > 0 && j <= i - window)) mask[i][j] = -1e30;
      }
    }
    return mask;
  }

  // Rotates t [..., S, d] by (cos, sin) [S, d]: HF's rotate_half layout.
  static at::Tensor RotateHalf(const at::Tensor& t, const std::pair<at::Tensor, at::Tensor>& rope) {
    const int64_t d = t.size(-1);
    const at::Tensor half = at::cat({-t.narrow(-1, d / 2, d / 2), t.narrow(-1, 0, d / 2)}, -1);
    return t * rope.first + half * rope.second;
  }

  // DeepSeek-V3's MLA: each head's score is q_nope.k_nope + q_rope.k_rope,
  // k_rope one per token shared by the heads; under rope_interleave (HF's
  // default true) the rope dims are pairs (x0, y0, x1, y1, ...), regrouped
  // into halves before rotating.
  at::Tensor Mla(const std::string& p, const at::Tensor& x, int64_t window) const {
    const int64_t b = x.size(0), s = x.size(1), heads = Int("num_attention_heads", 0), rank = Int("kv_lora_rank", 0);
    const int64_t nope = Int("qk_nope_head_dim", 128), rope = Int("qk_rope_head_dim", 64), vd = Int("v_head_dim", 128);
    auto lin = [&](const at::Tensor& t, const std::string& name) { return at::matmul(t, W(p + "." + name + ".weight").t()); };
    const at::Tensor q_flat = cfg.getInteger("q_lora_rank")
                                  ? lin(Rms(lin(x, "q_a_proj"), W(p + ".q_a_layernorm.weight"), 1e-6), "q_b_proj")
                                  : lin(x, "q_proj");
    const at::Tensor q = q_flat.view({b, s, heads, nope + rope});
    const at::Tensor compressed = lin(x, "kv_a_proj_with_mqa");  // [B, S, rank + rope]
    const at::Tensor kv = lin(Rms(compressed.narrow(-1, 0, rank), W(p + ".kv_a_layernorm.weight"), 1e-6), "kv_b_proj")
                              .view({b, s, heads, nope + vd});
    std::vector<int64_t> order;
    for (int64_t i = 0; i < rope; ++i) order.push_back(cfg.getBoolean("rope_interleave").getValueOr(true) ? (i < rope / 2 ? 2 * i : 2 * (i - rope / 2) + 1) : i);
    const at::Tensor perm = at::tensor(order);
    const auto cs = Rope(s, rope);
    const at::Tensor k_rope = RotateHalf(compressed.narrow(-1, rank, rope).index_select(-1, perm), cs);  // [B, S, rope]
    const at::Tensor mask = Mask(s, window);
    const double scale = SoftmaxScale(nope + rope);
    at::Tensor out = at::zeros({b, s, heads, vd});
    for (int64_t h = 0; h < heads; ++h) {
      const at::Tensor qh = q.select(2, h), kvh = kv.select(2, h);  // [B, S, *]
      const at::Tensor q_rope = RotateHalf(qh.narrow(-1, nope, rope).index_select(-1, perm), cs);
      const at::Tensor scores = at::matmul(qh.narrow(-1, 0, nope), kvh.narrow(-1, 0, nope).transpose(-1, -2)) +
                                at::matmul(q_rope, k_rope.transpose(-1, -2));
      out.select(2, h).copy_(at::matmul(at::softmax(scores * scale + mask, -1), kvh.narrow(-1, nope, vd)));
    }
    return lin(out.reshape({b, s, heads * vd}), "o_proj");
  }

  at::Tensor Attention(const std::string& p, const at::Tensor& x, int64_t window) const {
    if (Int("kv_lora_rank", 0) > 0) return Mla(p, x, window);
    const int64_t b = x.size(0), s = x.size(1), heads = Int("num_attention_heads", 0);
    const int64_t kv = Int("num_key_value_heads", heads), d = Int("head_dim", 0);
    const bool bias = Type() == "qwen2_moe" && cfg.getBoolean("qkv_bias").getValueOr(true);
    auto proj = [&](const char* name, int64_t n) {
      at::Tensor y = at::matmul(x, W(p + "." + name + ".weight").t());
      if (bias) y = y + W(p + "." + name + ".bias");
      return y.view({b, s, n, d}).transpose(1, 2);  // [B, n, S, d]
    };
    at::Tensor q = proj("q_proj", heads), k = proj("k_proj", kv), v = proj("v_proj", kv);
    if (Type() == "qwen3_moe") {
      q = Rms(q, W(p + ".q_norm.weight"), Num("rms_norm_eps", 1e-6));
      k = Rms(k, W(p + ".k_norm.weight"), Num("rms_norm_eps", 1e-6));
    }
    const auto rope = Rope(s, d);
    q = RotateHalf(q, rope), k = RotateHalf(k, rope);
    at::Tensor out = at::zeros({b, heads, s, d});
    const at::Tensor mask = Mask(s, window);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv);
      const at::Tensor scores = at::matmul(q.select(1, h), k.select(1, g).transpose(-1, -2)) * SoftmaxScale(d) + mask;
      out.select(1, h).copy_(at::matmul(at::softmax(scores, -1), v.select(1, g)));
    }
    return at::matmul(out.transpose(1, 2).reshape({b, s, heads * d}), W(p + ".o_proj.weight").t());
  }

  at::Tensor Forward(const at::Tensor& tokens) const {
    const double eps = Num("rms_norm_eps", 1e-6);
    const std::string mlp = Type() == "mixtral" ? "block_sparse_moe" : "mlp";
    at::Tensor h = W("model.embed_tokens.weight").index_select(0, tokens.reshape({-1})).view({tokens.size(0), tokens.size(1), -1});
    for (int64_t l = 0; l < Int("num_hidden_layers", 0); ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      h = h + Attention(p + ".self_attn", Rms(h, W(p + ".input_layernorm.weight"), eps), Window(l));
      const at::Tensor x = Rms(h, W(p + ".post_attention_layernorm.weight"), eps);
      const at::Tensor flat = x.reshape({-1, x.size(-1)});
      const at::Tensor m = IsMoe(l) ? Moe(p + "." + mlp, flat) : Mlp(p + "." + mlp, flat);
      h = h + m.view(x.sizes());
    }
    h = Rms(h, W("model.norm.weight"), eps);
    const bool tied = cfg.getBoolean("tie_word_embeddings").getValueOr(false);
    return at::matmul(h, W(tied ? "model.embed_tokens.weight" : "lm_head.weight").t());
  }
};

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

// DeepSeek-V3 MLA keys (4 heads, each its own key) plus `more`.
Object Mla(llvm::json::Value q_lora_rank, Object more) {
  Object o{{"q_lora_rank", std::move(q_lora_rank)}, {"kv_lora_rank", 8}, {"qk_nope_head_dim", 6},
           {"qk_rope_head_dim", 4},                 {"v_head_dim", 5},    {"num_key_value_heads", 4}};
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
        KeyCase{"norm_topk_prob_off", Family::kQwen2Moe, Object{{"norm_topk_prob", false}}, true},
        KeyCase{"routed_scaling_factor", Family::kDeepseekV3, Object{{"routed_scaling_factor", 1.0}}, true},
        KeyCase{"first_k_dense_replace_0", Family::kDeepseekV3, Object{{"first_k_dense_replace", 0}}, false},
        KeyCase{"moe_layer_freq_2", Family::kDeepseekV3, Object{{"first_k_dense_replace", 0}, {"moe_layer_freq", 2}}, false},
        KeyCase{"decoder_sparse_step_2", Family::kQwen3Moe, Object{{"decoder_sparse_step", 2}}, false},
        KeyCase{"mlp_only_layers_0", Family::kQwen2Moe, Object{{"mlp_only_layers", llvm::json::Array{0}}}, false},
        // Multi-head latent attention: with a q bottleneck and HF's default
        // interleaved rope dims, with a plain q_proj, and under yarn.
        KeyCase{"mla_q_lora", Family::kDeepseekV3, Mla(12, Object{}), false},
        KeyCase{"mla_no_q_lora", Family::kDeepseekV3, Mla(nullptr, Object{{"rope_interleave", false}}), false},
        KeyCase{"mla_yarn", Family::kDeepseekV3, Mla(12, Object{{"rope_scaling", Yarn(40.0, 1024, 1.0)}}), false},
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
