// How specialised a model's experts are, measured on a calibration batch:
// what `moerr proxy-eval` reports of a preset before and after its warm-up.
// Pruning to a proxy relies on experts that are redundant (their outputs
// alike) or rarely chosen; a router that is sure of its choice and experts
// whose outputs differ are what warm-up makes of a random model.
#pragma once

#include <ATen/core/Tensor.h>

#include "llvm/Support/JSON.h"
#include "moe/moe_transformer.h"

namespace moerr::proxy {

struct ExpertDiversity {
  // Mean over tokens and MoE layers of H(softmax(router logits)) / log(E), in
  // [0, 1]: 1 when the router prefers no expert (for DeepSeek-V3's sigmoid
  // router, the softmax of its raw scores).
  double routing_entropy = 0;
  // Mean over MoE layers of H(share of routed slots per expert) / log(E): 1
  // when every expert gets the same load.
  double load_entropy = 0;
  // Mean over MoE layers, tokens and pairs of distinct experts of
  // 1 - cos(expert a's output, expert b's output) on the same token, every
  // expert run on every (sampled) token's router input: 0 when experts are
  // interchangeable, ~1 for random independent ones.
  double output_cosine_distance = 0;
};

// `tokens` [n, S] int64; at most `max_tokens` router inputs per layer are run
// through every expert (the first ones).
ExpertDiversity MeasureExpertDiversity(moe::MoeTransformer& model, const at::Tensor& tokens, int64_t max_tokens = 256);

llvm::json::Object ToJson(const ExpertDiversity& d);

}  // namespace moerr::proxy
