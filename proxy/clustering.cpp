#include "proxy/clustering.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "support/enum_table.h"

namespace moerr::proxy {

at::Tensor CosineSimilarity(const at::Tensor& rows) {
  const at::Tensor n = rows.to(at::kDouble);
  const at::Tensor unit = n / n.norm(2, 1, /*keepdim=*/true).clamp_min(1e-30);
  return unit.mm(unit.t());
}

namespace {

at::Tensor CosineDistance(const at::Tensor& rows) {  // [E, d] -> [E, E]
  return (1 - CosineSimilarity(rows)).clamp_min(0);
}

// Original ids sorted by descending score (ties: lower id first).
std::vector<int64_t> ByScore(const at::Tensor& score, const std::vector<int64_t>& ids) {
  std::vector<int64_t> order = ids;
  const auto f = score.accessor<double, 1>();
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return f[a] > f[b]; });
  return order;
}

// HC-SMoE: average-linkage agglomerative clustering of `ids` by the cosine
// distance of their mean outputs down to `keep` clusters; each cluster's
// medoid (least summed distance to its members) is kept and stands for it.
// Two forced experts never share a cluster, and a forced one is its medoid.
void HcMedoids(const LayerStats& s, const std::vector<int64_t>& ids, int64_t keep, const std::vector<int64_t>& forced,
               std::vector<int64_t>& kept, std::vector<int64_t>& medoid_of) {
  auto forced_in = [&](const std::vector<int64_t>& c) {
    return std::count_if(c.begin(), c.end(),
                         [&](int64_t e) { return std::find(forced.begin(), forced.end(), e) != forced.end(); });
  };
  const at::Tensor d = CosineDistance(s.output_mean);
  const auto dist = d.accessor<double, 2>();
  std::vector<std::vector<int64_t>> clusters;
  for (int64_t e : ids) clusters.push_back({e});
  auto linkage = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    if (forced_in(a) > 0 && forced_in(b) > 0) return static_cast<double>(INFINITY);
    double sum = 0;
    for (int64_t x : a) {
      for (int64_t y : b) sum += dist[x][y];
    }
    return sum / (a.size() * b.size());
  };
  while (static_cast<int64_t>(clusters.size()) > keep) {
    size_t best_a = 0, best_b = 1;
    double best = INFINITY;
    for (size_t a = 0; a < clusters.size(); ++a) {
      for (size_t b = a + 1; b < clusters.size(); ++b) {
        const double l = linkage(clusters[a], clusters[b]);
        if (l < best) best = l, best_a = a, best_b = b;
      }
    }
    clusters[best_a].insert(clusters[best_a].end(), clusters[best_b].begin(), clusters[best_b].end());
    clusters.erase(clusters.begin() + best_b);
  }
  for (const std::vector<int64_t>& c : clusters) {
    int64_t medoid = c.front();
    double best = INFINITY;
    for (int64_t m : c) {
      double cost = 0;
      for (int64_t j : c) cost += dist[m][j];
      if (forced_in({m}) > 0) cost = -1;  // forced: the medoid
      if (cost < best - 1e-12) best = cost, medoid = m;
    }
    for (int64_t e : c) medoid_of[e] = medoid;
    kept.push_back(medoid);
  }
}

// The kept id of `medoids` nearest `e` (ties: the lower id).
int64_t Nearest(const at::TensorAccessor<double, 2>& dist, const std::vector<int64_t>& medoids, int64_t e) {
  int64_t best = medoids.front();
  for (int64_t m : medoids) {
    if (dist[e][m] < dist[e][best] || (dist[e][m] == dist[e][best] && m < best)) best = m;
  }
  return best;
}

// Each member's weight in the medoids' cost, per original id: its routed
// slots + 1 (cluster-frequency), times its REAP saliency over the layer's
// mean plus kSaliencyFloor (cluster: its saliency mass, so an expert the
// calibration never routed to still counts a little). A saliency that is
// not finite (an overflowing expert's) counts as the layer's largest finite
// one, NaN as 0, so every weight and gain stays finite.
constexpr double kSaliencyFloor = 1e-3;
std::vector<double> MemberWeights(const LayerStats& s, const std::vector<int64_t>& ids, bool salient) {
  const at::Tensor f = s.frequency.to(at::kDouble).contiguous(), raw = s.reap.to(at::kDouble);
  const at::Tensor finite = raw.isfinite();
  const double top = finite.any().item<bool>() ? raw.masked_select(finite).max().item<double>() : 0.0;
  const at::Tensor reap = raw.nan_to_num(0.0, top, 0.0).contiguous();
  const double mean_reap = salient ? std::max(reap.mean().item<double>(), 1e-30) : 1.0;
  std::vector<double> w(static_cast<size_t>(s.experts), 0.0);
  for (int64_t e : ids) {
    w[e] = (f.data_ptr<double>()[e] + 1) * (salient ? reap.data_ptr<double>()[e] / mean_reap + kSaliencyFloor : 1.0);
  }
  return w;
}

// Greedy facility location (cluster): after `medoids` (the forced keeps),
// adds until `keep` the expert whose addition lowers the cost
// sum_j w_j min_m dist[j][m] the most: a salient expert that a kept one
// already stands for adds little, one far from every kept one much (ties:
// the lower id).
void GreedyMedoids(const at::Tensor& d, const std::vector<int64_t>& ids, const std::vector<double>& w, int64_t keep,
                   std::vector<int64_t>& medoids) {
  const auto dist = d.accessor<double, 2>();
  const double far = d.max().item<double>();  // the cost of an expert before any medoid
  std::vector<double> cur(w.size(), far);
  for (int64_t m : medoids) {
    for (int64_t j : ids) cur[j] = std::min(cur[j], dist[j][m]);
  }
  while (static_cast<int64_t>(medoids.size()) < keep) {
    int64_t best = -1;
    double best_gain = -1;
    for (int64_t c : ids) {
      if (std::find(medoids.begin(), medoids.end(), c) != medoids.end()) continue;
      double gain = 0;
      for (int64_t j : ids) gain += w[j] * std::max(0.0, cur[j] - dist[j][c]);
      if (gain > best_gain) best_gain = gain, best = c;
    }
    medoids.push_back(best);
    for (int64_t j : ids) cur[j] = std::min(cur[j], dist[j][best]);
  }
}

// k-medoids (Voronoi iteration): each medoid after the first `fixed` (the
// forced keeps) moves to the member of its cluster with the least weighted
// distance to the cluster, until nothing moves (at most 50 rounds).
void RefineMedoids(const at::Tensor& d, const std::vector<int64_t>& ids, const std::vector<double>& w, size_t fixed,
                   std::vector<int64_t>& medoids) {
  const auto dist = d.accessor<double, 2>();
  for (int iteration = 0; iteration < 50; ++iteration) {
    bool changed = false;
    for (size_t c = fixed; c < medoids.size(); ++c) {
      std::vector<int64_t> members;  // the ids whose nearest medoid is medoids[c]
      for (int64_t e : ids) {
        if (Nearest(dist, medoids, e) == medoids[c]) members.push_back(e);
      }
      int64_t best = medoids[c];
      double best_cost = 0;
      for (int64_t j : members) best_cost += w[j] * dist[best][j];
      for (int64_t m : members) {
        double cost = 0;
        for (int64_t j : members) cost += w[j] * dist[m][j];
        if (cost < best_cost - 1e-12) best = m, best_cost = cost;
      }
      if (best != medoids[c]) medoids[c] = best, changed = true;
    }
    if (!changed) break;
  }
}

// Chooses `keep` of `ids` (one routing group, or the whole layer), `forced`
// among them first. Returns the kept ids and, per id, the kept id it maps to.
void PlanGroup(const LayerStats& s, const at::Tensor& d, const std::vector<int64_t>& ids, int64_t keep,
               const std::vector<int64_t>& forced, const ClusterOptions& options, std::vector<int64_t>& kept,
               std::vector<int64_t>& medoid_of) {
  if (options.method == Method::kHcMedoid) {
    HcMedoids(s, ids, keep, forced, kept, medoid_of);
    return;
  }
  std::vector<int64_t> medoids(forced.begin(), forced.end());
  auto add_until_full = [&](const std::vector<int64_t>& candidates) {
    for (int64_t e : candidates) {
      if (static_cast<int64_t>(medoids.size()) >= keep) break;
      if (std::find(medoids.begin(), medoids.end(), e) == medoids.end()) medoids.push_back(e);
    }
  };
  const std::vector<double> w = MemberWeights(s, ids, options.method == Method::kCluster);
  switch (options.method) {
    case Method::kCluster:
      GreedyMedoids(d, ids, w, keep, medoids);
      break;
    case Method::kRandom: {
      std::vector<int64_t> shuffled = ids;
      std::mt19937_64 rng(options.seed * 1000003 + s.layer);
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      add_until_full(shuffled);
      break;
    }
    case Method::kReap:
      add_until_full(ByScore(s.reap, ids));  // by saliency, descending
      break;
    default:  // frequency, cluster-frequency
      add_until_full(ByScore(s.frequency, ids));
  }
  if (options.method == Method::kCluster || options.method == Method::kClusterFrequency) {
    RefineMedoids(d, ids, w, forced.size(), medoids);
  }
  const auto dist = d.accessor<double, 2>();
  for (int64_t e : ids) medoid_of[e] = Nearest(dist, medoids, e);
  kept.insert(kept.end(), medoids.begin(), medoids.end());
}

}  // namespace

constexpr EnumName<Method> kMethods[] = {{Method::kCluster, "cluster"},
                                         {Method::kFrequency, "frequency"},
                                         {Method::kRandom, "random"},
                                         {Method::kReap, "reap"},
                                         {Method::kHcMedoid, "hc-medoid"},
                                         {Method::kClusterFrequency, "cluster-frequency"}};

absl::StatusOr<Method> ParseMethod(const std::string& name) { return ParseEnum(kMethods, "method", name); }

std::string MethodName(Method m) { return std::string(EnumNameOf(kMethods, m, "?")); }

std::vector<std::string> MethodNames() {
  std::vector<std::string> names;
  for (const EnumName<Method>& m : kMethods) names.emplace_back(m.name);
  return names;
}

at::Tensor FusedDistance(const LayerStats& s, const ClusterOptions& options) {
  const at::Tensor freq = s.frequency.clamp_min(1);
  // Co-activation similarity normalised by both frequencies: 1 for experts
  // always chosen together.
  const at::Tensor coact = (s.coactivation / (freq.unsqueeze(1) * freq.unsqueeze(0)).sqrt()).clamp(0, 1);
  const double total = options.w_router + options.w_coactivation + options.w_context;
  at::Tensor d = (options.w_router * CosineDistance(s.router_rows) + options.w_coactivation * (1 - coact) +
                  options.w_context * CosineDistance(s.context)) /
                 total;
  d.fill_diagonal_(0);
  return d.contiguous();
}

absl::StatusOr<LayerPlan> PlanLayer(const LayerStats& s, int64_t keep, const std::vector<int64_t>& implicated,
                                    const ClusterOptions& options) {
  const int64_t groups = std::max<int64_t>(1, options.groups);
  if (keep < 1 || keep > s.experts || keep % groups != 0 || s.experts % groups != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer %d: cannot keep %d of %d experts in %d routing groups (keep must divide evenly)", s.layer, keep,
        s.experts, groups));
  }
  LayerPlan plan;
  plan.layer = s.layer;
  std::vector<int64_t> forced;
  const int64_t per_group = s.experts / groups, quota = keep / groups;
  if (options.force) {
    forced = implicated;
    // Super experts, largest peak first, while their group has room.
    const at::Tensor peaks = s.max_activation;
    const double median = peaks.median().item<double>();
    std::vector<int64_t> super;
    for (int64_t e = 0; e < s.experts; ++e) {
      if (median > 0 && peaks[e].item<double>() > options.super_factor * median) super.push_back(e);
    }
    std::stable_sort(super.begin(), super.end(),
                     [&](int64_t a, int64_t b) { return peaks[a].item<double>() > peaks[b].item<double>(); });
    for (int64_t e : super) {
      const auto in_group = std::count_if(forced.begin(), forced.end(), [&](int64_t f) { return f / per_group == e / per_group; });
      if (std::find(forced.begin(), forced.end(), e) == forced.end() && in_group < quota) forced.push_back(e);
    }
    std::sort(forced.begin(), forced.end());
    forced.erase(std::unique(forced.begin(), forced.end()), forced.end());
  }
  plan.forced = forced;
  plan.medoid_of.assign(s.experts, -1);
  // A NaN distance (an expert whose routed context overflowed, as in a
  // faulty step) counts as the layer's largest finite one: left NaN, it
  // makes every greedy gain and k-medoids cost it enters NaN, and the plan
  // falls back to the lowest ids.
  at::Tensor d = FusedDistance(s, options);
  const at::Tensor finite = d.isfinite();
  const double far = finite.any().item<bool>() ? d.masked_select(finite).max().item<double>() : 1.0;
  d = d.nan_to_num(far, far, 0.0).contiguous();
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> ids(per_group), group_forced;
    std::iota(ids.begin(), ids.end(), g * per_group);
    for (int64_t e : forced) {
      if (e / per_group == g) group_forced.push_back(e);
    }
    if (static_cast<int64_t>(group_forced.size()) > quota) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "layer %d: %d experts are implicated in the failure but only %d may be kept%s", s.layer,
          group_forced.size(), quota, groups > 1 ? " per group" : ""));
    }
    PlanGroup(s, d, ids, quota, group_forced, options, plan.kept, plan.medoid_of);
  }
  std::sort(plan.kept.begin(), plan.kept.end());
  return plan;
}

}  // namespace moerr::proxy
