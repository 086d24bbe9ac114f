// Expert pruning surgery (DESIGN.md, "Proxy"): the backbone stays bitwise;
// each MoE layer keeps the planned experts in their original order, its
// router rows (and DeepSeek's correction bias) sliced the same way; top-k
// becomes min(top_k, kept), with grouped routing (DeepSeek-V3) also at most
// the experts of topk_group groups, and groups of one expert become one
// group (the same routing, in a form transformers loads). Named tensors of the original (weights, Adam
// moments) map to the proxy's names; recorded routing maps to kept experts.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/moe_config.h"
#include "proxy/clustering.h"
#include "proxy/step_bundle.h"

namespace moerr::proxy {

// The proxy's config: `kept` experts per MoE layer.
absl::StatusOr<moe::MoeConfig> ProxyConfig(const moe::MoeConfig& original, int64_t kept);

// Maps a tensor of the original, by its HF name (optionally behind a
// "prefix/"), to the proxy: an expert's tensor is renamed to its new index or
// dropped (nullopt); a router's weight rows and correction bias are sliced;
// everything else is returned as it is (the same tensor).
std::optional<std::pair<std::string, at::Tensor>> MapTensor(const std::string& name, const at::Tensor& t,
                                                            const std::vector<LayerPlan>& plans);

// `step` pruned to `plans` with `proxy_config`: trainer state mapped
// (MapTensor), recorded routing mapped (MapRouting) with its logits sliced to
// the kept experts, implicated experts renumbered.
StepBundle PruneStep(const StepBundle& step, const moe::MoeConfig& proxy_config, const std::vector<LayerPlan>& plans);

// Recorded routing of a layer, `ids` [T, k] original ids, `logits` [T, E] (may
// be undefined), to [T, k'] new ids: each id to its medoid, duplicates within a
// token replaced by the next-best kept expert by the logits (or by id order).
at::Tensor MapRouting(const at::Tensor& ids, const at::Tensor& logits, const LayerPlan& plan, int64_t top_k);

}  // namespace moerr::proxy
