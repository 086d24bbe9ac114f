// cluster (the default): medoids chosen and moved by saliency mass, so a
// proxy keeps the salient experts (REAP's criterion) but not two that stand
// for each other (the clustering's); cluster-frequency, the frequency-weighted
// k-medoids, keeps neither promise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "proxy/clustering.h"

namespace moerr::proxy {
namespace {

// Four experts of one layer: 0, 1, 2 alike (router rows near (1, 0)), 3 apart
// and the most salient by 100x; 3 is also selected a little more often.
LayerStats FourExperts() {
  LayerStats s;
  s.layer = 0;
  s.experts = 4;
  s.frequency = at::tensor({10.0, 10.0, 10.0, 11.0}, at::kDouble);
  s.weight_mass = s.frequency.clone();
  s.coactivation = at::diag(s.frequency);
  s.router_rows = at::tensor({1.0f, 0.0f, 1.0f, 0.1f, 1.0f, -0.1f, 1.0f, 1.0f}).view({4, 2});
  s.context = s.router_rows.clone();
  s.max_activation = at::ones({4}, at::kDouble);
  s.reap = at::tensor({1.0, 1.0, 1.0, 100.0}, at::kDouble);
  s.output_mean = s.router_rows.clone();
  return s;
}

TEST(SaliencyClusterTest, TheDefaultKeepsTheSalientExpert) {
  ClusterOptions options;
  ASSERT_EQ(options.method, Method::kCluster);
  const LayerPlan salient = PlanLayer(FourExperts(), 1, {}, options).value();
  EXPECT_EQ(salient.kept, (std::vector<int64_t>{3}));
  for (int64_t m : salient.medoid_of) EXPECT_EQ(m, 3);
  options.method = Method::kClusterFrequency;
  const LayerPlan plain = PlanLayer(FourExperts(), 1, {}, options).value();
  ASSERT_EQ(plain.kept.size(), 1u);
  EXPECT_NE(plain.kept[0], 3);  // frequency weights: a medoid among the alike 0, 1, 2
  EXPECT_EQ(ParseMethod("cluster-frequency").value(), Method::kClusterFrequency);
  EXPECT_EQ(MethodName(Method::kCluster), "cluster");
}

// Three experts: 0 and 1 the most salient and interchangeable (the same
// router row and context, always chosen together), 2 apart and half as
// salient. Keeping two, REAP keeps 0 and 1; the default keeps 0, which also
// stands for 1, and 2.
LayerStats TwinsAndAnother() {
  LayerStats s;
  s.layer = 0;
  s.experts = 3;
  s.frequency = at::tensor({10.0, 10.0, 10.0}, at::kDouble);
  s.weight_mass = s.frequency.clone();
  s.coactivation = at::tensor({10.0, 10.0, 0.0, 10.0, 10.0, 0.0, 0.0, 0.0, 10.0}, at::kDouble).view({3, 3});
  s.router_rows = at::tensor({1.0f, 0.0f, 1.0f, 0.01f, 0.0f, 1.0f}).view({3, 2});
  s.context = s.router_rows.clone();
  s.max_activation = at::ones({3}, at::kDouble);
  s.reap = at::tensor({10.0, 9.0, 5.0}, at::kDouble);
  s.output_mean = s.router_rows.clone();
  return s;
}

TEST(SaliencyClusterTest, TheDefaultSkipsASalientExpertAKeptOneStandsFor) {
  ClusterOptions options;
  const LayerPlan plan = PlanLayer(TwinsAndAnother(), 2, {}, options).value();
  EXPECT_EQ(plan.kept, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(plan.medoid_of, (std::vector<int64_t>{0, 0, 2}));
  options.method = Method::kReap;
  EXPECT_EQ(PlanLayer(TwinsAndAnother(), 2, {}, options).value().kept, (std::vector<int64_t>{0, 1}));
  // A forced keep stays: with 1 implicated, 1 stands for 0 and 2 is kept.
  options.method = Method::kCluster;
  const LayerPlan forced = PlanLayer(TwinsAndAnother(), 2, {1}, options).value();
  EXPECT_EQ(forced.kept, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(forced.medoid_of, (std::vector<int64_t>{1, 1, 2}));
}

// An overflowing expert's saliency (Inf) or a NaN one still gives a plan of
// kept experts that every expert maps onto.
TEST(SaliencyClusterTest, ANonFiniteSaliencyStillPlans) {
  LayerStats s = FourExperts();
  s.reap = at::tensor({1.0, NAN, INFINITY, 100.0}, at::kDouble);
  const LayerPlan plan = PlanLayer(s, 2, {}, ClusterOptions()).value();
  ASSERT_EQ(plan.kept.size(), 2u);
  for (int64_t e : plan.kept) EXPECT_TRUE(e >= 0 && e < 4) << e;
  for (int64_t m : plan.medoid_of) EXPECT_TRUE(std::count(plan.kept.begin(), plan.kept.end(), m)) << m;
}

// An expert whose routed context overflowed has NaN distances to every
// other; the greedy medoids still choose by saliency among the rest.
TEST(SaliencyClusterTest, ANaNDistanceStillKeepsTheSalientExpert) {
  LayerStats s = FourExperts();
  s.context[1][0] = INFINITY;
  ASSERT_TRUE(FusedDistance(s, ClusterOptions())[1][0].isnan().item<bool>());
  const LayerPlan plan = PlanLayer(s, 1, {}, ClusterOptions()).value();
  EXPECT_EQ(plan.kept, (std::vector<int64_t>{3}));
  for (int64_t m : plan.medoid_of) EXPECT_EQ(m, 3);
}

}  // namespace
}  // namespace moerr::proxy
