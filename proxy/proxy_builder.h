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
#include "proxy/clustering.h"

namespace moerr::proxy {

struct ProxyOptions {
  int64_t step = -1;          // default: the first step with an overflow, else the first complete one
  int64_t keep = 0;           // experts kept per layer; 0: keep_fraction of them
  double keep_fraction = 0.25;
  int64_t ep = 1;             // expert-parallel size: the kept count is rounded up to a multiple of it
  ClusterOptions cluster;
  std::string out_dir;        // required
  bool overwrite = false;
  std::string source = "the bundle";  // the bundle's path, named in errors
};

struct ProxyReport {
  int64_t step = 0;
  int64_t experts = 0, kept = 0;  // per MoE layer
  std::vector<LayerPlan> plans;
  std::vector<std::pair<int64_t, int64_t>> implicated;  // (layer, expert) named by the recorded first overflow
  int64_t params_original = 0, params_proxy = 0;         // policy parameters
  std::string bundle, checkpoint, cluster_map;           // written paths
};

absl::StatusOr<ProxyReport> BuildProxy(const formats::BundleReader& reader, const ProxyOptions& options);

}  // namespace moerr::proxy
