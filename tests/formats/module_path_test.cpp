#include "formats/module_path.h"

#include <gtest/gtest.h>

namespace moerr::formats {
namespace {

TEST(ModulePath, ReadsLayerExpertAndClass) {
  const ModulePath p = ParseModulePath("model.layers.3.mlp.experts.12.down_proj");
  EXPECT_EQ(p.layer, 3);
  EXPECT_EQ(p.expert, 12);
  EXPECT_EQ(p.module_class, "model.layers.mlp.experts.down_proj");
  EXPECT_EQ(ExpertOf("model.layers.3.mlp.experts.12"), std::make_pair(int64_t{3}, int64_t{12}));
}

TEST(ModulePath, ALayerWithoutAnExpert) {
  const ModulePath p = ParseModulePath("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(p.layer, 0);
  EXPECT_FALSE(p.expert.has_value());
  EXPECT_EQ(p.module_class, "model.layers.self_attn.q_proj");
  EXPECT_FALSE(ExpertOf("model.layers.0.mlp.shared_experts.up_proj").has_value());
}

TEST(ModulePath, PathsOutsideTheLayersNameNoLayer) {
  for (const char* path : {"", "lm_head", "model.embed_tokens", "model.layers.x.mlp.experts.1",
                           "model.layers.1.mlp.experts.1x", "model.layers.99999999999999999999.mlp"}) {
    const ModulePath p = ParseModulePath(path);
    EXPECT_FALSE(p.expert.has_value()) << path;
    EXPECT_FALSE(ExpertOf(path).has_value()) << path;
  }
  EXPECT_FALSE(ParseModulePath("model.layers.99999999999999999999.mlp").layer.has_value());
  EXPECT_EQ(ModuleClass("layer 1"), "layer");
}

}  // namespace
}  // namespace moerr::formats
