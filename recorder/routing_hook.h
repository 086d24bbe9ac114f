// The hook a model calls after each routing decision. Header-only: models
// (moe/) include it without linking the recorder, and the recorder
// implements it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace moerr::recorder {

// Shapes: T tokens, k experts per token, E experts.
struct RoutingEvent {
  int64_t layer = 0;
  const at::Tensor& topk_ids;      // [T, k] int64, the experts each token goes to
  const at::Tensor& topk_weights;  // [T, k], the weights of their outputs
  const at::Tensor& logits;        // [T, E] fp32, the router's raw scores
  const at::Tensor& hidden;        // [T, hidden], the router's input (routed context)
};

class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  virtual void OnRouting(const RoutingEvent& event) = 0;
};

}  // namespace moerr::recorder
