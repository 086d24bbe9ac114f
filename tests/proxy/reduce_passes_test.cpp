// Each reduce pass of passes.def on its own: what a candidate removes, that
// the failing layer and expert survive (renumbered), and that the weights,
// Adam state and routing stay consistent with the candidate's config.
#include "proxy/passes/reduce_pass.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "absl/strings/str_format.h"
#include "moe/addition_task.h"
#include "proxy/step_bundle.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::proxy {
namespace {

using formats::testing::TempDir;

// One recorded fault-free step of the tiny model (2 layers, 8 experts, top-2,
// 8 prompts x 4 responses), read once for every test.
class ReducePassTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    auto reader = testing::RecordTinySteps(dir_->File("r.moerr"), moe::Precision::kFp32,
                                           recorder::CaptureMode::kReplayable, 1);
    step_ = new StepBundle(LoadStepBundle(*reader, 0).value());
  }
  static void TearDownTestSuite() {
    delete step_;
    delete dir_;
  }

  static std::unique_ptr<ReducePass> Pass(absl::string_view name) {
    for (auto& pass : AllReducePasses()) {
      if (pass->name() == name) return std::move(pass);
    }
    ADD_FAILURE() << "no pass " << name;
    return nullptr;
  }

  // Distinct (layer, expert) pairs the state names, by "model.layers.L.mlp.experts.E.".
  static std::set<std::pair<int64_t, int64_t>> ExpertsIn(const StepBundle& b) {
    static const std::regex re(R"(model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.)");
    std::set<std::pair<int64_t, int64_t>> out;
    for (const auto& [name, t] : b.state.tensors) {
      std::smatch m;
      if (std::regex_search(name, m, re)) out.emplace(std::stoll(m[1]), std::stoll(m[2]));
    }
    return out;
  }

  static TempDir* dir_;
  static StepBundle* step_;
};
TempDir* ReducePassTest::dir_ = nullptr;
StepBundle* ReducePassTest::step_ = nullptr;

TEST_F(ReducePassTest, PassesRunInTheOrderOfTheDefList) {
  std::vector<std::string> names;
  for (const auto& pass : AllReducePasses()) names.emplace_back(pass->name());
  EXPECT_EQ(names, (std::vector<std::string>{"prune-experts", "prune-layers", "truncate-tokens", "shrink-batch"}));
}

TEST_F(ReducePassTest, PruneExpertsHalvesEveryLayerAndKeepsTheImplicatedExpert) {
  StepBundle step = *step_;
  ASSERT_EQ(step.config.num_experts, 8);
  ASSERT_FALSE(step.routing.empty());
  step.implicated = {{1, 5}};
  const std::vector<Candidate> candidates = Pass("prune-experts")->Propose(step);
  ASSERT_EQ(candidates.size(), 1u);
  const StepBundle& b = candidates[0].bundle;
  EXPECT_EQ(b.config.num_experts, 4);
  EXPECT_EQ(candidates[0].removed, "experts per MoE layer 8 -> 4");
  std::set<std::pair<int64_t, int64_t>> want;
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t e = 0; e < 4; ++e) want.emplace(layer, e);
  }
  EXPECT_EQ(ExpertsIn(b), want);
  // Expert 5 of layer 1 is kept under its new index, its weights unchanged.
  ASSERT_EQ(b.implicated.size(), 1u);
  const auto [layer, expert] = b.implicated[0];
  EXPECT_EQ(layer, 1);
  std::map<std::string, at::Tensor> before(step.state.tensors.begin(), step.state.tensors.end());
  std::map<std::string, at::Tensor> after(b.state.tensors.begin(), b.state.tensors.end());
  auto down = [](int64_t e) { return absl::StrFormat("policy/model.layers.1.mlp.experts.%d.down_proj.weight", e); };
  EXPECT_TRUE(after.at(down(expert)).equal(before.at(down(5))));
  EXPECT_EQ(after.at("policy/model.layers.0.mlp.gate.weight").size(0), 4);
  // Every recorded decision names kept experts only, distinct per token.
  ASSERT_EQ(b.routing.size(), step.routing.size());
  for (const RoutingEntry& r : b.routing) {
    EXPECT_GE(r.ids.min().item<int64_t>(), 0);
    EXPECT_LT(r.ids.max().item<int64_t>(), 4);
    EXPECT_TRUE(r.ids.select(1, 0).ne(r.ids.select(1, 1)).all().item<bool>());
    EXPECT_FALSE(r.weights.defined());  // recorded for the original's experts
  }
  // Down to top-k, nothing is left to remove.
  StepBundle two = b;
  two.config.num_experts = 2;
  EXPECT_TRUE(Pass("prune-experts")->Propose(two).empty());
}

TEST_F(ReducePassTest, PruneLayersNeverDropsTheFailingLayer) {
  StepBundle step = *step_;
  step.implicated = {{1, 3}};
  const std::vector<Candidate> candidates = Pass("prune-layers")->Propose(step);
  ASSERT_EQ(candidates.size(), 1u);  // layer 0 only: layer 1 fails
  const StepBundle& b = candidates[0].bundle;
  EXPECT_EQ(b.config.num_layers, 1);
  EXPECT_EQ(candidates[0].removed, "decoder layers 2 -> 1 (layer 0)");
  // Layer 1 moved down to 0 with its weights, Adam state and routing.
  EXPECT_EQ(b.implicated, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}}));
  std::map<std::string, at::Tensor> before(step.state.tensors.begin(), step.state.tensors.end());
  std::map<std::string, at::Tensor> after(b.state.tensors.begin(), b.state.tensors.end());
  EXPECT_TRUE(after.at("policy/model.layers.0.mlp.gate.weight").equal(before.at("policy/model.layers.1.mlp.gate.weight")));
  for (const auto& [name, t] : after) EXPECT_EQ(name.find("model.layers.1."), std::string::npos) << name;
  int64_t layer1 = 0;
  for (const RoutingEntry& r : step.routing) layer1 += r.layer == 1;
  ASSERT_EQ(static_cast<int64_t>(b.routing.size()), layer1);
  for (const RoutingEntry& r : b.routing) EXPECT_EQ(r.layer, 0);
  // One layer left: nothing to drop.
  EXPECT_TRUE(Pass("prune-layers")->Propose(b).empty());
}

TEST_F(ReducePassTest, PruneLayersLeavesALayerPatternAlone) {
  StepBundle step = *step_;
  ASSERT_FALSE(Pass("prune-layers")->Propose(step).empty());
  // Every other layer MoE (Qwen's decoder_sparse_step): dropping a layer
  // would turn the layers after it from MoE to dense and back.
  step.config.decoder_sparse_step = 2;
  EXPECT_TRUE(Pass("prune-layers")->Propose(step).empty());
}

// A Qwen2-MoE model that slides its window in some layers (layer_types):
// each layer that survives a drop keeps its own window flag, and the
// candidate's config is valid and builds with the renumbered weights.
TEST_F(ReducePassTest, PruneLayersKeepsEachLayersSlidingWindow) {
  llvm::json::Object hf = moe::ToHfConfig(moe::Preset("tiny", moe::Family::kQwen2Moe).value());
  hf["num_hidden_layers"] = 3, hf["use_sliding_window"] = true, hf["sliding_window"] = 2;
  hf["layer_types"] = llvm::json::Array{"sliding_attention", "full_attention", "sliding_attention"};
  StepBundle step;
  step.config = moe::FromHfConfig(hf).value();
  const std::vector<bool> flags = {true, false, true};
  ASSERT_EQ(step.config.sliding_layers, flags);
  moe::MoeTransformer model(step.config);
  for (const auto& [name, t] : model->NamedTensors()) step.state.tensors.emplace_back("policy/" + name, t.detach().clone());
  const std::vector<Candidate> candidates = Pass("prune-layers")->Propose(step);
  ASSERT_EQ(candidates.size(), 3u);  // layers 2, 1, 0
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t drop = 2 - i;
    const moe::MoeConfig& c = candidates[i].bundle.config;
    std::vector<bool> kept = flags;
    kept.erase(kept.begin() + drop);
    EXPECT_EQ(c.sliding_layers, kept) << "layer " << drop << " dropped";
    ASSERT_TRUE(moe::Validate(c).ok()) << moe::Validate(c);
    for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.WindowOf(l), kept[l] ? 2 : 0) << drop << " " << l;
    auto policy = LoadPolicy(candidates[i].bundle);
    EXPECT_TRUE(policy.ok()) << policy.status();
  }
}

TEST_F(ReducePassTest, TruncateTokensHalvesTheResponseAndRoutesLive) {
  const int64_t tokens = moe::ResponseTokens(step_->options, moe::AdditionTask());
  ASSERT_GT(tokens, 1);
  std::vector<Candidate> candidates = Pass("truncate-tokens")->Propose(*step_);
  ASSERT_EQ(candidates.size(), 1u);
  StepBundle b = candidates[0].bundle;
  EXPECT_EQ(b.options.response_tokens, tokens / 2);
  EXPECT_TRUE(b.routing.empty());
  EXPECT_EQ(b.state.tensors.size(), step_->state.tensors.size());  // the model is untouched
  b.options.response_tokens = 1;
  EXPECT_TRUE(Pass("truncate-tokens")->Propose(b).empty());
}

TEST_F(ReducePassTest, ShrinkBatchHalvesPromptsOrResponsesDownToAGroupOfTwo) {
  ASSERT_EQ(step_->options.prompts, 8);
  ASSERT_EQ(step_->options.group_size, 4);
  const std::vector<Candidate> candidates = Pass("shrink-batch")->Propose(*step_);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].bundle.options.prompts, 4);
  EXPECT_EQ(candidates[0].bundle.options.group_size, 4);
  EXPECT_EQ(candidates[1].bundle.options.prompts, 8);
  EXPECT_EQ(candidates[1].bundle.options.group_size, 2);
  for (const Candidate& c : candidates) EXPECT_TRUE(c.bundle.routing.empty());
  StepBundle smallest = *step_;
  smallest.options.prompts = 1;
  smallest.options.group_size = 2;
  EXPECT_TRUE(Pass("shrink-batch")->Propose(smallest).empty());
}

}  // namespace
}  // namespace moerr::proxy
