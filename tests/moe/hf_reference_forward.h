// A plain-ATen forward of an HF MoE checkpoint, written from the published
// formulas (HF's modeling code, DeepSeek-V3's yarn) for the config-key tests:
// it reads the raw config.json and the tensors by HF name, shares no code with
// moe/, and computes in fp32 (rope tables in double).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "llvm/Support/JSON.h"

namespace moerr::moe::reference {

using llvm::json::Object;
using Tensors = std::map<std::string, at::Tensor>;

inline at::Tensor Rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * (x.pow(2).mean(-1, true) + eps).rsqrt());
}

inline at::Tensor Act(const std::string& name, const at::Tensor& x) {
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
    const std::string type = RopeType();
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
      const bool truncate = rs->getBoolean("truncate").getValueOr(true);
      double lo = corr(rs->getNumber("beta_fast").getValueOr(32)), hi = corr(rs->getNumber("beta_slow").getValueOr(1));
      if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
      lo = std::max(0.0, lo), hi = std::min<double>(dim - 1, hi);
      if (lo == hi) hi += 0.001;
      for (int64_t i = 0; i < dim / 2; ++i) {
        const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
        inv[i] = inv[i] / factor * ramp + inv[i] * (1 - ramp);
      }
      // transformers: attention_factor, else the mscale ratio when both are set, else mscale(factor, 1).
      auto ms = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
      const double m = rs->getNumber("mscale").getValueOr(0), all = rs->getNumber("mscale_all_dim").getValueOr(0);
      magnitude = rs->getNumber("attention_factor").getValueOr(m != 0 && all != 0 ? ms(m) / ms(all) : ms(1));
    } else if (type == "llama3") {
      const double orig = *rs->getNumber("original_max_position_embeddings");
      const double low = *rs->getNumber("low_freq_factor"), high = *rs->getNumber("high_freq_factor");
      for (double& f : inv) {
        const double wavelen = 2 * M_PI / f;
        if (wavelen > orig / low) {
          f /= factor;
        } else if (wavelen >= orig / high) {
          const double smooth = (orig / wavelen - low) / (high - low);
          f = (1 - smooth) * f / factor + smooth * f;
        }
      }
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

  // rope_scaling's type ("type" or "rope_type"), "" without one.
  std::string RopeType() const {
    const Object* rs = cfg.getObject("rope_scaling");
    return rs ? rs->getString("type").getValueOr(rs->getString("rope_type").getValueOr("")).str() : "";
  }

  // HF DeepseekV3Attention: qk_head_dim^-0.5, times yarn_get_mscale(factor,
  // mscale_all_dim)^2 under any rope_scaling but the default when
  // mscale_all_dim is set (yarn_get_mscale is 1 for factor <= 1).
  double SoftmaxScale(int64_t dim) const {
    double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    const Object* rs = cfg.getObject("rope_scaling");
    if (Type() == "deepseek_v3" && rs && RopeType() != "default") {
      const double m = rs->getNumber("mscale_all_dim").getValueOr(0), factor = *rs->getNumber("factor");
      if (m != 0 && factor > 1) scale *= std::pow(0.1 * m * std::log(factor) + 1.0, 2);
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
  // into halves before rotating. q_a_layernorm and kv_a_layernorm are built
  // with DeepseekV3RMSNorm's default eps, 1e-6, whatever rms_norm_eps says.
  at::Tensor Mla(const std::string& p, const at::Tensor& x, int64_t window) const {
    const int64_t b = x.size(0), s = x.size(1), heads = Int("num_attention_heads", 0), rank = Int("kv_lora_rank", 0);
    const int64_t nope = Int("qk_nope_head_dim", 128), rope = Int("qk_rope_head_dim", 64), vd = Int("v_head_dim", 128);
    auto lin = [&](const at::Tensor& t, const std::string& name) { return at::matmul(t, W(p + "." + name + ".weight").t()); };
    // q_lora_rank: absent is HF's default 1536 (a bottleneck); only null is a plain q_proj.
    const llvm::json::Value* q_lora = cfg.get("q_lora_rank");
    const at::Tensor q_flat = q_lora == nullptr || !q_lora->getAsNull()
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

}  // namespace moerr::moe::reference
