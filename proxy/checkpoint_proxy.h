// moerr proxy --checkpoint DIR: an HF checkpoint mapped onto fewer experts
// per MoE layer without loading it whole. The expert statistics come from a
// layer-by-layer calibration pass (layer_calibration.h); the plans from the
// same clustering as a bundle's proxy (clustering.h); every tensor goes
// through the same surgery (MapTensor), read and written one at a time
// (CheckpointReader, CheckpointWriter): the write never reads a dropped
// expert's tensors (the calibration reads every tensor). Peak memory: one
// decoder layer in fp32 during calibration, one tensor while writing, and the
// statistics. Every file is written under OUT/.proxy.partial/ and moved into
// OUT only when all are written (config.json last, then an earlier proxy's
// weight files this one did not write removed); a failed run removes the
// staging directory and leaves OUT as it was. OUT the checkpoint itself is
// refused. Writes to OUT
//   config.json      the original's object with the family's expert-count
//                    key (num_experts, n_routed_experts, num_local_experts)
//                    and num_experts_per_tok updated; every other key as it was
//   model.safetensors, or model-0000i-of-0000n.safetensors and
//                    model.safetensors.index.json when the original is sharded
//                    (shards of at most the original's largest shard's size)
//   clusters.json    per layer: kept experts, what each maps to, forced keeps
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "moe/moe_config.h"
#include "proxy/clustering.h"
#include "proxy/layer_calibration.h"
#include "proxy/proxy_builder.h"

namespace moerr::proxy {

// The most calibration tokens a run takes (CalibrationOptions::tokens): the
// activations of 2^20 tokens are 2^20 x hidden x 4 bytes per layer (28 GB at
// DeepSeek-V3's hidden size 7168).
inline constexpr int64_t kMaxCalibrationTokens = int64_t{1} << 20;

struct CheckpointProxyOptions {
  std::string checkpoint;  // the original's directory
  ProxyOptions proxy;      // keep / keep_fraction, ep, cluster, out_dir, overwrite
  CalibrationOptions calibration;  // tokens: at most kMaxCalibrationTokens; each row cut to it
  // > 0: shards of at most this many bytes (even of a one-file original);
  // 0: the original's style, shards of at most its largest shard's size.
  uint64_t max_shard_bytes = 0;
  std::function<void(const std::string&)> progress;  // a line per layer and per shard; may be empty
};

struct CheckpointProxyReport {
  int64_t experts = 0, kept = 0;  // per MoE layer
  int64_t top_k = 0, proxy_top_k = 0;
  std::vector<std::string> changed_keys;  // config.json keys written with new values
  std::vector<LayerPlan> plans;
  int64_t calibration_sequences = 0, calibration_tokens = 0;
  uint64_t checkpoint_bytes = 0;  // tensor data of the original
  uint64_t bytes_read = 0;        // all reads: calibration and the kept tensors
  uint64_t calibration_bytes_read = 0;
  uint64_t bytes_written = 0;     // tensor data of the proxy
  int64_t tensors_written = 0, tensors_dropped = 0;
  bool sharded = false;
  std::vector<std::string> shards;  // file names under out_dir
  double calibration_seconds = 0, write_seconds = 0;
  int64_t calibration_peak_rss = 0, peak_rss = 0;  // bytes (VmHWM after each phase)
  std::string out_dir, cluster_map;
};

absl::StatusOr<CheckpointProxyReport> ProxyCheckpoint(const CheckpointProxyOptions& options);

// The plan of every MoE layer from its statistics (no forced failure; super
// experts forced when options.force), as ProxyCheckpoint makes them.
absl::StatusOr<std::vector<LayerPlan>> PlanCheckpointLayers(const std::vector<LayerStats>& stats, int64_t kept,
                                                            const moe::MoeConfig& config, ClusterOptions options);

// The keys of the family's config.json (ToHfConfig) whose values differ
// between `from` and `to`, with their values in `to`, by name.
std::vector<std::pair<std::string, llvm::json::Value>> ChangedHfKeys(const moe::MoeConfig& from,
                                                                     const moe::MoeConfig& to);
// config.json's text `original` (a JSON object) with the top-level values of
// `changed` replaced in place (a key it lacks is appended): every other
// byte, key order and number spelling included, stays as it was.
absl::StatusOr<std::string> EditHfConfigText(const std::string& original,
                                             const std::vector<std::pair<std::string, llvm::json::Value>>& changed);

}  // namespace moerr::proxy
