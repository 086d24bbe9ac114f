// moerr proxy: the recorded step mapped onto a model with fewer experts
// (DESIGN.md, "Proxy"). Rebuilds the trainer at the step from the bundle,
// collects expert statistics (recorded routing + a calibration forward),
// plans the kept experts per layer, prunes weights and Adam moments, maps the
// recorded routing, and writes
//   OUT/proxy.moerr     a bundle `moerr replay --model` runs (the original's
//                       step metrics kept as "metrics", for comparison)
//   OUT/checkpoint/     the proxy policy as an HF checkpoint
//   OUT/clusters.json   per layer: kept experts, what each expert maps to,
//                       forced keeps
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/world_run.h"
#include "proxy/clustering.h"

namespace moerr::proxy {

struct ProxyOptions {
  int64_t step = -1;  // default: the first step with an overflow, else the first complete one
  int64_t keep = 0;   // experts kept per layer; 0: keep_fraction of them
  double keep_fraction = 0.25;
  int64_t ep = 1;     // expert-parallel size: the kept count is rounded up to a multiple of it
  int64_t ranks = 0;  // BuildWorldProxy: the proxy's ranks (M, dividing the run's), its EP size too
  bool whole_batch = false;  // BuildWorldProxy: train on every rank's shard, not M ranks' (below)
  ClusterOptions cluster;
  std::string out_dir;  // required
  bool overwrite = false;
  std::string source = "the bundle";  // the bundle's path, named in errors
};

struct ProxyReport {
  int64_t step = 0;
  int64_t experts = 0, kept = 0;  // per MoE layer
  std::vector<LayerPlan> plans;
  std::vector<std::pair<int64_t, int64_t>> implicated;  // (layer, expert) named by the recorded first overflow
  int64_t params_original = 0, params_proxy = 0;        // policy parameters
  std::string bundle, checkpoint, cluster_map;          // written paths (bundle: the run directory of a world's)
  int64_t original_ranks = 1, ranks = 1;                // of a world's proxy
  int64_t failure_rank = -1;                            // where the run's first overflow began
  std::vector<int64_t> shards;  // of a world's proxy: the original ranks whose batch it trains on
};

// Experts kept per MoE layer: options.keep, else keep_fraction of them,
// rounded up to a multiple of the expert-parallel size and of the routing
// groups (each group keeps its share); an error past the layer's experts.
absl::StatusOr<int64_t> KeptCount(const moe::MoeConfig& config, const ProxyOptions& options);

absl::StatusOr<ProxyReport> BuildProxy(const formats::BundleReader& reader, const ProxyOptions& options);

// `moerr proxy RUN --ranks M`: a step of an N-rank expert-parallel run (the
// first whose world overflowed, else rank 0's first complete one) as one
// world step (LoadWorldStepBundle), mapped as above with the kept count a
// multiple of M, onto M ranks of EP M. Proxy expert j of a layer (the
// original's kept[j], in the original's order) is hosted by proxy rank
// j / (kept / M); a cluster's tokens go to its kept expert, so they land on
// its rank. The proxy keeps the shards of M consecutive original ranks, the
// rank the failure began on among them (the first M without one), proxy
// rank m training on the m-th: the same experts and tokens per rank as the
// original, so its step costs a rank what the original's did, on M ranks
// instead of N. With whole_batch, it trains on every rank's shard, proxy
// rank m on those of original ranks [m*N/M, (m+1)*N/M). Writes
//   OUT/world.json, OUT/rank<m>.moerr  the proxy run: each bundle holds the
//                       proxy's state, its shard's mapped routing and
//                       responses, the original's metrics, and "proxy":
//                       the clusters, the placement (each proxy rank's
//                       experts, the original experts and ranks they stand
//                       for) and the run's failure
//   OUT/checkpoint/, OUT/clusters.json as for a bundle.
// `moerr replay OUT` runs it on its M ranks (replayer/world_replay.h).
absl::StatusOr<ProxyReport> BuildWorldProxy(formats::WorldStep& world, const ProxyOptions& options);

}  // namespace moerr::proxy
