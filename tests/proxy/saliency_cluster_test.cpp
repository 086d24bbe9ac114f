// cluster-saliency: the k-medoids of `cluster` with each member weighted by
// its saliency mass, so a medoid moves to the salient expert that plain
// frequency weighting leaves.
#include <gtest/gtest.h>

#include "proxy/clustering.h"

namespace moerr::proxy {
namespace {

// Four experts of one layer: 0, 1, 2 alike (router rows near (1, 0)), 3 apart
// and the most salient by 100x; 3 is also selected a little more often, so
// both methods start from it.
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

TEST(SaliencyClusterTest, SaliencyMassMovesTheMedoidToTheSalientExpert) {
  ClusterOptions options;
  options.method = Method::kCluster;
  const LayerPlan plain = PlanLayer(FourExperts(), 1, {}, options).value();
  ASSERT_EQ(plain.kept.size(), 1u);
  EXPECT_NE(plain.kept[0], 3);  // frequency weights: a medoid among the alike 0, 1, 2
  options.method = Method::kClusterSaliency;
  const LayerPlan salient = PlanLayer(FourExperts(), 1, {}, options).value();
  ASSERT_EQ(salient.kept.size(), 1u);
  EXPECT_EQ(salient.kept[0], 3);
  for (int64_t m : salient.medoid_of) EXPECT_EQ(m, 3);
  EXPECT_EQ(ParseMethod("cluster-saliency").value(), Method::kClusterSaliency);
}

}  // namespace
}  // namespace moerr::proxy
