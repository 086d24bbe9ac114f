#include "moe/moe_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"

namespace moerr::moe {
namespace {

constexpr Family kFamilies[] = {Family::kQwen2Moe, Family::kQwen3Moe, Family::kDeepseekV3, Family::kMixtral};

// Every field a preset or its family sets, on one line:
// hidden size, layers, heads/kv heads x head dim, dense MLP width,
// experts x expert width, top-k, shared experts x shared width | router,
// groups/eligible, routed scale, dense layers | attention bias, qk norm |
// MLA q rank, kv rank, nope dims, rope dims, v dims, interleave.
std::string Key(const MoeConfig& c) {
  return absl::StrFormat(
      "h%d L%d a%d/%dx%d ffn%d e%dx%d k%d sh%dx%d | %s g%d/%d s%g dense%d | bias%d qknorm%d | mla %d %d %d %d %d %d",
      c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.num_experts,
      c.moe_intermediate_size, c.top_k, c.num_shared_experts, c.shared_expert_intermediate_size,
      c.router == RouterKind::kSoftmaxTopK ? "softmax" : "sigmoid", c.n_group, c.topk_group, c.routed_scaling_factor,
      c.first_k_dense, c.attention_bias, c.qk_norm, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
      c.qk_rope_head_dim, c.v_head_dim, c.rope_interleave);
}

struct Pinned {
  const char* preset;
  Family family;
  const char* key;
};

// The configs the presets have given since they were written; a change here
// changes every recording, warm-up cache and benchmark made from a preset.
constexpr Pinned kPinned[] = {
    {"tiny", Family::kQwen2Moe, "h32 L2 a4/2x8 ffn64 e8x16 k2 sh1x32 | softmax g1/1 s1 dense0 | bias1 qknorm0 | mla 0 0 0 0 0 0"},
    {"tiny", Family::kQwen3Moe, "h32 L2 a4/2x8 ffn64 e8x16 k2 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm1 | mla 0 0 0 0 0 0"},
    {"tiny", Family::kDeepseekV3, "h32 L2 a4/2x8 ffn64 e8x16 k2 sh1x0 | sigmoid g4/2 s2.5 dense1 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"tiny", Family::kMixtral, "h32 L2 a4/2x8 ffn64 e8x16 k2 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"tiny-fine", Family::kQwen2Moe, "h32 L2 a4/2x8 ffn64 e16x8 k4 sh1x32 | softmax g1/1 s1 dense0 | bias1 qknorm0 | mla 0 0 0 0 0 0"},
    {"tiny-fine", Family::kQwen3Moe, "h32 L2 a4/2x8 ffn64 e16x8 k4 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm1 | mla 0 0 0 0 0 0"},
    {"tiny-fine", Family::kDeepseekV3, "h32 L2 a4/2x8 ffn64 e16x8 k4 sh1x0 | sigmoid g4/2 s2.5 dense1 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"tiny-fine", Family::kMixtral, "h32 L2 a4/2x8 ffn64 e16x8 k4 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"tiny-mla", Family::kDeepseekV3, "h32 L2 a4/4x4 ffn64 e8x16 k2 sh1x0 | sigmoid g4/2 s2.5 dense1 | bias0 qknorm0 | mla 16 8 8 4 8 1"},
    {"small", Family::kQwen2Moe, "h96 L4 a6/2x16 ffn192 e32x48 k4 sh1x96 | softmax g1/1 s1 dense0 | bias1 qknorm0 | mla 0 0 0 0 0 0"},
    {"small", Family::kQwen3Moe, "h96 L4 a6/2x16 ffn192 e32x48 k4 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm1 | mla 0 0 0 0 0 0"},
    {"small", Family::kDeepseekV3, "h96 L4 a6/2x16 ffn192 e32x48 k4 sh1x0 | sigmoid g4/2 s2.5 dense1 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"small", Family::kMixtral, "h96 L4 a6/2x16 ffn192 e32x48 k4 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"fine", Family::kQwen2Moe, "h96 L4 a6/2x16 ffn192 e64x24 k8 sh1x96 | softmax g1/1 s1 dense0 | bias1 qknorm0 | mla 0 0 0 0 0 0"},
    {"fine", Family::kQwen3Moe, "h96 L4 a6/2x16 ffn192 e64x24 k8 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm1 | mla 0 0 0 0 0 0"},
    {"fine", Family::kDeepseekV3, "h96 L4 a6/2x16 ffn192 e64x24 k8 sh1x0 | sigmoid g8/4 s2.5 dense1 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"fine", Family::kMixtral, "h96 L4 a6/2x16 ffn192 e64x24 k8 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"wide", Family::kQwen2Moe, "h128 L4 a8/4x16 ffn256 e128x32 k8 sh1x64 | softmax g1/1 s1 dense0 | bias1 qknorm0 | mla 0 0 0 0 0 0"},
    {"wide", Family::kQwen3Moe, "h128 L4 a8/4x16 ffn256 e128x32 k8 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm1 | mla 0 0 0 0 0 0"},
    {"wide", Family::kDeepseekV3, "h128 L4 a8/4x16 ffn256 e128x32 k8 sh1x0 | sigmoid g4/2 s2.5 dense1 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"wide", Family::kMixtral, "h128 L4 a8/4x16 ffn256 e128x32 k8 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"wide-ep", Family::kQwen2Moe, "h64 L2 a4/2x16 ffn128 e64x32 k4 sh1x64 | softmax g1/1 s1 dense0 | bias1 qknorm0 | mla 0 0 0 0 0 0"},
    {"wide-ep", Family::kQwen3Moe, "h64 L2 a4/2x16 ffn128 e64x32 k4 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm1 | mla 0 0 0 0 0 0"},
    {"wide-ep", Family::kDeepseekV3, "h64 L2 a4/2x16 ffn128 e64x32 k4 sh1x0 | sigmoid g4/2 s2.5 dense1 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
    {"wide-ep", Family::kMixtral, "h64 L2 a4/2x16 ffn128 e64x32 k4 sh0x0 | softmax g1/1 s1 dense0 | bias0 qknorm0 | mla 0 0 0 0 0 0"},
};

TEST(PresetTest, EachPresetAndFamilyGivesItsPinnedConfig) {
  for (const Pinned& p : kPinned) {
    const absl::StatusOr<MoeConfig> c = Preset(p.preset, p.family);
    ASSERT_TRUE(c.ok()) << p.preset << " " << FamilyName(p.family) << ": " << c.status();
    EXPECT_EQ(c->family, p.family) << p.preset;
    EXPECT_EQ(Key(*c), p.key) << p.preset << " " << FamilyName(p.family);
  }
}

// What no preset sets keeps MoeConfig's defaults.
TEST(PresetTest, FieldsNoPresetSetsKeepTheirDefaults) {
  const MoeConfig d;
  for (const Pinned& p : kPinned) {
    const MoeConfig c = Preset(p.preset, p.family).value();
    SCOPED_TRACE(absl::StrFormat("%s %s", p.preset, FamilyName(p.family)));
    EXPECT_EQ(c.vocab_size, d.vocab_size);
    EXPECT_EQ(c.norm_topk_prob, d.norm_topk_prob);
    EXPECT_EQ(c.moe_layer_freq, d.moe_layer_freq);
    EXPECT_EQ(c.decoder_sparse_step, d.decoder_sparse_step);
    EXPECT_EQ(c.hidden_act, d.hidden_act);
    EXPECT_EQ(c.rope_scaling.type, d.rope_scaling.type);
    EXPECT_EQ(c.max_position_embeddings, d.max_position_embeddings);
    EXPECT_EQ(c.sliding_window, d.sliding_window);
    EXPECT_TRUE(c.sliding_layers.empty());
    EXPECT_EQ(c.rope_theta, d.rope_theta);
    EXPECT_EQ(c.rms_norm_eps, d.rms_norm_eps);
    EXPECT_EQ(c.tie_word_embeddings, d.tie_word_embeddings);
    EXPECT_EQ(c.router_aux_loss_coef, d.router_aux_loss_coef);
  }
}

TEST(PresetTest, DefaultFamilyIsQwen3Moe) {
  EXPECT_EQ(Key(Preset("small").value()), Key(Preset("small", Family::kQwen3Moe).value()));
  EXPECT_EQ(Preset("small").value().family, Family::kQwen3Moe);
}

TEST(PresetTest, UnknownNamesAndFamiliesAreRefusedNamingTheChoices) {
  const absl::Status unknown = Preset("huge").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "unknown preset \"huge\" (tiny, tiny-fine, tiny-mla, small, fine, wide, wide-ep)");
  EXPECT_FALSE(Preset("").ok());
  EXPECT_FALSE(Preset("Tiny").ok());
  for (Family f : kFamilies) {
    if (f == Family::kDeepseekV3) continue;
    const absl::Status mla = Preset("tiny-mla", f).status();
    EXPECT_EQ(mla.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(mla.message(), "preset tiny-mla has DeepSeek-V3's multi-head latent attention: family deepseek_v3");
  }
}

// The names errors and help text list are those Preset takes, each pinned above.
TEST(PresetTest, NamesAndHelpListEveryPresetOnce) {
  const std::vector<std::string> names = PresetNames();
  EXPECT_EQ(names, (std::vector<std::string>{"tiny", "tiny-fine", "tiny-mla", "small", "fine", "wide", "wide-ep"}));
  const std::string help = PresetHelp();
  for (const std::string& name : names) {
    EXPECT_TRUE(Preset(name, Family::kDeepseekV3).ok()) << name;
    EXPECT_EQ(std::count_if(std::begin(kPinned), std::end(kPinned), [&](const Pinned& p) { return p.preset == name; }),
              name == "tiny-mla" ? 1 : 4)
        << name;
    EXPECT_NE(help.find(absl::StrFormat("%-10s ", name)), std::string::npos) << help;
  }
  EXPECT_EQ(std::count(help.begin(), help.end(), '\n'), static_cast<int64_t>(names.size())) << help;
  EXPECT_NE(help.find("tiny-mla   tiny with DeepSeek-V3's multi-head latent attention"), std::string::npos) << help;
}

}  // namespace
}  // namespace moerr::moe
