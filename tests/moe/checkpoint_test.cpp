#include "moe/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "formats/hf_checkpoint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/testing/test_util.h"

namespace moerr::moe {
namespace {

using formats::testing::TempDir;

struct FamilyCase {
  Family family;
  std::vector<std::string> names;  // HF names the checkpoint must hold
};

class CheckpointTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(CheckpointTest, RoundTripsWithHfNames) {
  TempDir dir;
  torch::manual_seed(0);
  MoeTransformer model(Preset("tiny", GetParam().family).value());
  ASSERT_TRUE(SaveCheckpoint(model, dir.File("ckpt"), false).ok());
  auto raw = formats::LoadHfCheckpoint(dir.File("ckpt"));
  ASSERT_TRUE(raw.ok()) << raw.status();
  for (const std::string& name : GetParam().names) EXPECT_TRUE(raw->tensors.count(name)) << name;
  EXPECT_EQ(*raw->config.getString("model_type"), FamilyName(GetParam().family));

  auto loaded = LoadCheckpoint(dir.File("ckpt"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto a = model->NamedTensors(), b = (*loaded)->NamedTensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  }
  const at::Tensor tokens = at::randint(0, 16, {2, 5}, at::kLong);
  EXPECT_TRUE(model->forward(tokens).equal((*loaded)->forward(tokens)));
}

INSTANTIATE_TEST_SUITE_P(
    Families, CheckpointTest,
    ::testing::Values(
        FamilyCase{Family::kQwen2Moe,
                   {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.7.down_proj.weight",
                    "model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight",
                    "model.layers.0.self_attn.q_proj.bias", "lm_head.weight"}},
        FamilyCase{Family::kQwen3Moe,
                   {"model.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.1.self_attn.q_norm.weight",
                    "model.embed_tokens.weight", "model.norm.weight"}},
        FamilyCase{Family::kDeepseekV3,
                   {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                    "model.layers.1.mlp.shared_experts.down_proj.weight", "model.layers.1.mlp.experts.0.up_proj.weight"}},
        FamilyCase{Family::kMixtral,
                   {"model.layers.0.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.2.w1.weight",
                    "model.layers.1.block_sparse_moe.experts.2.w2.weight",
                    "model.layers.1.block_sparse_moe.experts.2.w3.weight"}}),
    [](const auto& info) { return FamilyName(info.param.family); });

TEST(CheckpointTest, LoadingIsStrictAndNamesEveryProblem) {
  MoeTransformer model(Preset("tiny").value());
  std::map<std::string, formats::TensorView> tensors;
  std::vector<at::Tensor> keep;
  for (const auto& [name, t] : model->NamedTensors()) {
    keep.push_back(t.detach().clone());
    tensors[name] = recorder::ViewOf(keep.back()).value();
  }
  keep.push_back(at::zeros({3}));
  tensors["model.layers.9.mlp.gate.weight"] = recorder::ViewOf(keep.back()).value();
  tensors.erase("model.norm.weight");
  keep.push_back(at::zeros({5, 5}));
  tensors["lm_head.weight"] = recorder::ViewOf(keep.back()).value();
  keep.push_back(at::zeros({16, 32}, at::kInt));
  tensors["model.embed_tokens.weight"] = recorder::ViewOf(keep.back()).value();
  const absl::Status s = LoadWeights(model, tensors);
  ASSERT_FALSE(s.ok());
  const std::string msg(s.message());
  EXPECT_NE(msg.find("unexpected tensor \"model.layers.9.mlp.gate.weight\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor \"model.norm.weight\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"lm_head.weight\": shape [5, 5], the model needs [16, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"model.embed_tokens.weight\": dtype i32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
}

TEST(ConfigTest, HfConfigRoundTripsPerFamily) {
  for (Family f : {Family::kQwen2Moe, Family::kQwen3Moe, Family::kDeepseekV3, Family::kMixtral}) {
    const MoeConfig c = Preset("small", f).value();
    auto back = FromHfConfig(ToHfConfig(c));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(llvm::json::Value(ToHfConfig(*back)), llvm::json::Value(ToHfConfig(c))) << FamilyName(f);
  }
  EXPECT_FALSE(FromHfConfig(llvm::json::Object{{"model_type", "llama"}}).ok());
  EXPECT_FALSE(Preset("huge").ok());
}

}  // namespace
}  // namespace moerr::moe
