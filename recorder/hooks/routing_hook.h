// The hooks a model calls around each routing decision. Header-only: models
// (moe/) include it without linking the recorder or the replayer, which
// implement them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace moerr::recorder {

// Shapes: T tokens, k experts per token, E experts.
struct RoutingEvent {
  int64_t layer = 0;
  const at::Tensor& topk_ids;      // [T, k] int64, the experts each token goes to
  const at::Tensor& topk_weights;  // [T, k], the weights of their outputs
  const at::Tensor& logits;        // [T, E] fp32, the router's raw scores; may be undefined
  const at::Tensor& hidden;        // [T, hidden], the router's input (routed context)
};

class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  virtual void OnRouting(const RoutingEvent& event) = 0;
};

// Routing replay: decides which experts each token goes to in place of the
// router's own choice. Called once per routing decision, in execution order.
class RoutingSource {
 public:
  virtual ~RoutingSource() = default;
  // `live_ids` [T, k] int64: the router's own choice. Returns the ids to use,
  // [T, k] int64 with values in [0, num_experts); returning `live_ids` routes live.
  virtual at::Tensor Route(int64_t layer, const at::Tensor& live_ids, int64_t num_experts) = 0;
};

}  // namespace moerr::recorder
