// Which experts a proxy keeps (DESIGN.md, "Proxy").
//
// cluster (default): saliency-weighted k-medoids. Distances between experts
//   fused from router-row cosine, co-activation and routed-context cosine;
//   each expert weighted by its saliency mass (routed slots x REAP saliency
//   over the layer's mean); medoids chosen greedily after the forced keeps,
//   each time the expert that most lowers the weighted distance of every
//   expert to its nearest medoid (so a salient expert a kept one already
//   stands for is skipped), then refined by k-medoids under the same
//   weights; forced keeps stay medoids. Every expert maps to its nearest
//   medoid.
// cluster-frequency: the same distances and k-medoids, initialised with the
//   forced keeps and then the most frequent experts, each member weighted by
//   its routed slots alone (moerr's default before saliency).
// frequency: the most frequently selected experts.
// random: a seeded random subset.
// reap: the experts of highest router-weighted output norm (REAP saliency).
// hc-medoid: average-linkage agglomerative clustering of the experts' mean
//   outputs (cosine), one medoid per cluster (HC-SMoE style); every expert
//   maps to its cluster's medoid.
// Forced keeps (all methods but the baselines when told): experts implicated
// in the recorded failure, then super experts (output peak past
// `super_factor` times the layer's median peak), largest peak first, while
// slots remain. With grouped routing (DeepSeek-V3 n_group >
// 1) each group keeps keep / n_group experts, chosen within the group. Other
// methods map a dropped expert to its nearest kept one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/expert_stats.h"

namespace moerr::proxy {

enum class Method { kCluster, kFrequency, kRandom, kReap, kHcMedoid, kClusterFrequency };
absl::StatusOr<Method> ParseMethod(const std::string& name);
std::string MethodName(Method m);
std::vector<std::string> MethodNames();  // every method, in the table's order

struct ClusterOptions {
  Method method = Method::kCluster;
  double w_router = 1.0, w_coactivation = 1.0, w_context = 1.0;  // distance fusion weights
  double super_factor = 10.0;
  bool force = true;      // keep implicated and super experts
  uint64_t seed = 0;      // kRandom
  int64_t groups = 1;     // n_group of grouped routing
};

struct LayerPlan {
  int64_t layer = 0;
  std::vector<int64_t> kept;       // original ids, ascending: new expert i is kept[i]
  std::vector<int64_t> medoid_of;  // per original expert: the kept expert it maps to
  std::vector<int64_t> forced;     // forced keeps, ascending
};

// Cosine similarity of every pair of rows, [E, d] -> [E, E] f64 (router rows:
// how alike two experts' routing preferences are).
at::Tensor CosineSimilarity(const at::Tensor& rows);

// [E, E] fused distance matrix (0 on the diagonal) of a layer.
at::Tensor FusedDistance(const LayerStats& s, const ClusterOptions& options);

// `keep` experts of `s`; `implicated` are original ids forced in (failure).
absl::StatusOr<LayerPlan> PlanLayer(const LayerStats& s, int64_t keep, const std::vector<int64_t>& implicated,
                                    const ClusterOptions& options);

}  // namespace moerr::proxy
