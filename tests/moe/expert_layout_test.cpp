// transformers 5's fused expert layout (experts.gate_up_proj [E, 2I, H],
// experts.down_proj [E, H, I], Mixtral's block under mlp.) loads into the
// same model as the per-expert layout, and its bad shapes, mixed layouts and
// fused tensors of dense layers are errors naming the tensor and the layer.
#include "moe/expert_layout.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>

#include "formats/hf_checkpoint.h"
#include "moe/checkpoint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/testing/test_util.h"

namespace moerr::moe {
namespace {

using formats::testing::TempDir;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

// `model`'s tensors in transformers 5's fused layout, in its names.
Named Fused(const MoeTransformer& model) {
  const MoeConfig& c = model->config();
  const std::regex expert(R"(model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight)");
  std::map<int64_t, std::map<std::string, std::vector<at::Tensor>>> per_layer;  // layer -> projection -> [E]
  Named out;
  for (const auto& [name, t] : model->NamedTensors()) {
    std::smatch m;
    if (std::regex_match(name, m, expert)) {
      auto& list = per_layer[std::stoll(m[1])][m[4]];
      list.resize(c.num_experts);
      list[std::stoll(m[3])] = t.detach();
    } else {
      const std::string renamed = std::regex_replace(name, std::regex(R"(\.block_sparse_moe\.)"), ".mlp.");
      out.emplace_back(renamed, t.detach());
    }
  }
  const bool mixtral = c.family == Family::kMixtral;
  for (auto& [layer, proj] : per_layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    std::vector<at::Tensor> gate_up;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      gate_up.push_back(at::cat({proj[mixtral ? "w1" : "gate_proj"][e], proj[mixtral ? "w3" : "up_proj"][e]}, 0));
    }
    out.emplace_back(prefix + "gate_up_proj", at::stack(gate_up));
    out.emplace_back(prefix + "down_proj", at::stack(proj[mixtral ? "w2" : "down_proj"]));
  }
  return out;
}

std::string Write(const TempDir& dir, const std::string& name, const MoeConfig& c, const Named& tensors) {
  std::vector<std::pair<std::string, formats::TensorView>> views;
  for (const auto& [n, t] : tensors) views.emplace_back(n, recorder::ViewOf(t.contiguous()).value());
  const std::string path = dir.File(name);
  EXPECT_TRUE(formats::SaveHfCheckpoint(path, ToHfConfig(c), views, false).ok());
  return path;
}

class FusedLayoutTest : public ::testing::TestWithParam<Family> {};

TEST_P(FusedLayoutTest, LoadsAsTheSameModel) {
  TempDir dir;
  torch::manual_seed(0);
  MoeTransformer model(Preset("tiny", GetParam()).value());
  const Named fused = Fused(model);
  bool has_fused = false;
  for (const auto& [name, t] : fused) has_fused |= name.find("experts.gate_up_proj") != std::string::npos;
  ASSERT_TRUE(has_fused);
  auto loaded = LoadCheckpoint(Write(dir, "fused", model->config(), fused));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto a = model->NamedTensors(), b = (*loaded)->NamedTensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 16, {2, 5}, at::kLong);
  EXPECT_TRUE(model->forward(tokens).equal((*loaded)->forward(tokens)));
}

INSTANTIATE_TEST_SUITE_P(Families, FusedLayoutTest,
                         ::testing::Values(Family::kQwen2Moe, Family::kQwen3Moe, Family::kDeepseekV3, Family::kMixtral),
                         [](const auto& info) { return FamilyName(info.param); });

// The error of loading `tensors` as a checkpoint of `c`.
std::string LoadError(const MoeConfig& c, const Named& tensors) {
  TempDir dir;
  auto loaded = LoadCheckpoint(Write(dir, "bad", c, tensors));
  EXPECT_FALSE(loaded.ok());
  return loaded.ok() ? "" : std::string(loaded.status().message());
}

TEST(FusedLayoutTest, BadShapesMixedLayoutsAndDenseLayersNameTheTensorAndLayer) {
  torch::manual_seed(0);
  const MoeConfig c = Preset("tiny", Family::kQwen3Moe).value();
  MoeTransformer model(c);
  const Named fused = Fused(model);

  Named wrong = fused;
  for (auto& [name, t] : wrong) {
    if (name == "model.layers.1.mlp.experts.down_proj") t = t.transpose(1, 2);  // [E, I, H]
  }
  std::string msg = LoadError(c, wrong);
  EXPECT_NE(msg.find("\"model.layers.1.mlp.experts.down_proj\" (layer 1, fused experts) has shape [8, 16, 32]; "
                     "config.json implies [8, 32, 16]"),
            std::string::npos)
      << msg;

  Named mixed = fused;
  mixed.emplace_back("model.layers.0.mlp.experts.3.up_proj.weight", at::zeros({16, 32}));
  msg = LoadError(c, mixed);
  EXPECT_NE(msg.find("holds \"model.layers.0.mlp.experts.3.up_proj.weight\" twice, once as "
                     "\"model.layers.0.mlp.experts.gate_up_proj\""),
            std::string::npos)
      << msg;

  MoeConfig dense_first = c;
  dense_first.first_k_dense = 1;
  msg = LoadError(dense_first, fused);
  EXPECT_NE(msg.find("\"model.layers.0.mlp.experts.down_proj\": layer 0 is not a MoE layer"), std::string::npos)
      << msg;
}

TEST(FusedLayoutTest, NamesOfFusedTensors) {
  EXPECT_TRUE(IsFusedExpertsName("model.layers.12.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(IsFusedExpertsName("model.layers.0.mlp.experts.down_proj"));
  EXPECT_FALSE(IsFusedExpertsName("model.layers.0.mlp.experts.0.down_proj.weight"));
  EXPECT_FALSE(IsFusedExpertsName("model.layers.x.mlp.experts.down_proj"));
  EXPECT_FALSE(IsFusedExpertsName("lm_head.weight"));
}

}  // namespace
}  // namespace moerr::moe
