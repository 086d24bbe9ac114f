#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "moe/moe_transformer.h"
#include "moe/numerics.h"

namespace moerr::moe {
namespace {

MoeConfig Tiny(Family family) { return Preset("tiny", family).value(); }

class FamilyTest : public ::testing::TestWithParam<Family> {};

TEST_P(FamilyTest, ForwardShapesAndFiniteLogits) {
  torch::manual_seed(0);
  MoeTransformer model(Tiny(GetParam()));
  const at::Tensor tokens = at::randint(0, 16, {3, 7}, at::kLong);
  const ForwardOutput out = model->Forward(tokens, /*keep_hidden=*/true);
  EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{3, 7, 16}));
  EXPECT_EQ(out.hidden.size(), 2u);
  EXPECT_TRUE(out.logits.isfinite().all().item<bool>());
  EXPECT_GT(model->AuxLoss().item<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest,
                         ::testing::Values(Family::kQwen2Moe, Family::kQwen3Moe, Family::kDeepseekV3, Family::kMixtral),
                         [](const auto& info) { return FamilyName(info.param); });

// Runs every expert on every token and mixes with the router's weights: the
// grouped dispatch must give the same result.
TEST(MoeLayerTest, GroupedDispatchMatchesDenseReference) {
  torch::manual_seed(1);
  MoeConfig config = Tiny(Family::kQwen3Moe);
  MoeLayer layer(config, 0, "model.layers.0.mlp");
  const at::Tensor x = at::randn({2, 5, config.hidden_size});
  const at::Tensor got = layer->forward(x).reshape({-1, config.hidden_size});
  const at::Tensor flat = x.reshape({-1, config.hidden_size});
  const RouterOutput r = layer->gate()->forward(flat);
  at::Tensor want = at::zeros_like(flat);
  for (int64_t e = 0; e < config.num_experts; ++e) {
    const at::Tensor weight = (r.topk_weights * r.topk_ids.eq(e)).sum(1, true);  // [T, 1]
    want = want + layer->expert(e)->forward(flat) * weight;
  }
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << (got - want).abs().max();
  EXPECT_EQ(layer->expert_counts().sum().item<int64_t>(), flat.size(0) * config.top_k);
}

TEST(RouterTest, SoftmaxTopKWeightsAreRenormalised) {
  torch::manual_seed(2);
  MoeConfig config = Tiny(Family::kQwen3Moe);
  Router router(config, 0, "r");
  const RouterOutput r = router->forward(at::randn({10, config.hidden_size}));
  EXPECT_TRUE(at::allclose(r.topk_weights.sum(1), at::ones({10})));
  // The chosen experts are the k most probable.
  const at::Tensor kth = std::get<0>(r.probs.topk(config.top_k, -1)).select(1, config.top_k - 1);
  EXPECT_TRUE(r.probs.gather(1, r.topk_ids).ge(kth.unsqueeze(1)).all().item<bool>());
}

TEST(RouterTest, GroupedTopKStaysInTheBestGroups) {
  torch::manual_seed(3);
  MoeConfig config = Tiny(Family::kDeepseekV3);  // 8 experts, 4 groups of 2, 2 eligible
  Router router(config, 0, "r");
  const RouterOutput r = router->forward(at::randn({50, config.hidden_size}));
  const at::Tensor groups = r.topk_ids.div(config.num_experts / config.n_group, "floor");
  for (int64_t t = 0; t < 50; ++t) {
    std::set<int64_t> distinct;
    for (int64_t j = 0; j < config.top_k; ++j) distinct.insert(groups[t][j].item<int64_t>());
    EXPECT_LE(static_cast<int64_t>(distinct.size()), config.topk_group);
  }
  // Weights: renormalised sigmoid scores times the scaling factor.
  EXPECT_TRUE(at::allclose(r.topk_weights.sum(1), at::full({50}, config.routed_scaling_factor)));
}

TEST(RouterTest, ForcedRoutingUsesGivenIdsAndKeepsGradients) {
  torch::manual_seed(4);
  MoeConfig config = Tiny(Family::kQwen3Moe);
  Router router(config, 0, "r");
  struct Fixed : recorder::RoutingSource {
    at::Tensor ids = at::tensor({0, 1, 2, 3, 4, 5}, at::kLong).view({3, 2});
    int64_t layer = -1, experts = 0;
    at::Tensor Route(int64_t l, const at::Tensor&, int64_t num_experts) override {
      layer = l;
      experts = num_experts;
      return ids;
    }
  } source;
  router->set_source(&source);
  const RouterOutput r = router->forward(at::randn({3, config.hidden_size}));
  EXPECT_TRUE(r.topk_ids.equal(source.ids));
  EXPECT_EQ(source.layer, 0);
  EXPECT_EQ(source.experts, config.num_experts);
  r.topk_weights.select(1, 0).sum().backward();
  EXPECT_GT(router->weight.grad().abs().sum().item<double>(), 0.0);
}

struct Capture : recorder::RoutingObserver {
  std::vector<int64_t> layers;
  void OnRouting(const recorder::RoutingEvent& e) override {
    layers.push_back(e.layer);
    EXPECT_EQ(e.topk_ids.sizes(), e.topk_weights.sizes());
    EXPECT_EQ(e.logits.size(0), e.topk_ids.size(0));
  }
};

TEST(ModelTest, RoutersReportToTheObserver) {
  MoeConfig config = Tiny(Family::kDeepseekV3);  // layer 0 dense, layer 1 MoE
  MoeTransformer model(config);
  Capture capture;
  model->SetRoutingObserver(&capture);
  model->forward(at::randint(0, 16, {2, 4}, at::kLong));
  EXPECT_EQ(capture.layers, (std::vector<int64_t>{1}));
}

TEST(ModelTest, ModulesPushTheirPathsAsUserScopes) {
  static std::set<std::string>* scopes = new std::set<std::string>();
  scopes->clear();
  auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            scopes->insert(fn.name());
            return nullptr;
          })
          .scopes({at::RecordScope::USER_SCOPE}));
  MoeTransformer model(Tiny(Family::kMixtral));
  model->forward(at::randint(0, 16, {2, 4}, at::kLong));
  at::removeCallback(handle);
  EXPECT_TRUE(scopes->count("model.layers.1.self_attn"));
  EXPECT_TRUE(scopes->count("model.layers.1.block_sparse_moe.gate"));
  bool expert = false;
  for (const auto& s : *scopes) expert |= s.rfind("model.layers.0.block_sparse_moe.experts.", 0) == 0;
  EXPECT_TRUE(expert);
}

TEST(NumericsTest, Fp16EmulationOverflowsOrSaturates) {
  const at::Tensor x = at::tensor({1.0f, 70000.0f, -1e6f});
  const at::Tensor inf = RoundToFp16(x, false), sat = RoundToFp16(x, true);
  EXPECT_TRUE(std::isinf(inf[1].item<float>()));
  EXPECT_EQ(sat[1].item<float>(), 65504.0f);
  EXPECT_EQ(sat[2].item<float>(), -65504.0f);
  // Boundary rounds gradients too.
  at::Tensor y = at::tensor({1.0f}).requires_grad_();
  {
    NumericsScope scope({Precision::kFp16Emu, false});
    (Boundary(y) * 1e6).sum().backward();
  }
  EXPECT_TRUE(std::isinf(y.grad()[0].item<float>()));
}

// The experts' activation range (trained-precision): off by default, and
// then the same tensor; within it values and gradients are bitwise
// unchanged; past it +-Inf.
TEST(NumericsTest, ExpertActivationRangeChangesNothingWithinIt) {
  const at::Tensor act = at::tensor({0.5f, -7.5f, 7.25f, -0.0f, 8.0f, -9.0f});
  EXPECT_TRUE(ExpertActivationRange(act).is_same(act)) << "no range: the same tensor, no op";
  at::Tensor x = act.slice(0, 0, 4).clone().requires_grad_();
  NumericsScope scope({Precision::kFp32, false, 7.5});
  const at::Tensor in = ExpertActivationRange(x);
  EXPECT_TRUE(at::equal(in, x.detach()));
  EXPECT_TRUE(std::signbit(in[3].item<float>()));
  in.sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), at::ones({4})));
  const at::Tensor out = ExpertActivationRange(act);
  EXPECT_EQ(out[4].item<float>(), INFINITY);
  EXPECT_EQ(out[5].item<float>(), -INFINITY);
  // In bf16 and fp16 (autocast) and double alike: no NaN within the range.
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kDouble}) {
    const at::Tensor typed = ExpertActivationRange(act.to(dtype)).to(at::kFloat);
    EXPECT_TRUE(at::equal(typed.slice(0, 0, 4), act.slice(0, 0, 4).to(dtype).to(at::kFloat))) << dtype;
    EXPECT_EQ(typed[4].item<float>(), INFINITY) << dtype;
    EXPECT_EQ(typed[5].item<float>(), -INFINITY) << dtype;
  }
}

}  // namespace
}  // namespace moerr::moe
