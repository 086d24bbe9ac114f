// Per-expert statistics of each MoE layer (DESIGN.md, "Proxy"), the inputs of
// expert clustering: from the step's recorded routing, selection frequency,
// router-weight mass and co-activation; from a calibration forward pass of the
// model, the routed-context prototype (mean router input of the tokens routed
// to an expert), the expert's largest output activation, its REAP saliency
// and its mean output over all tokens; from the weights, the router rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/moe_transformer.h"
#include "proxy/step_bundle.h"
#include "recorder/hooks/routing_hook.h"

namespace moerr::proxy {

struct LayerStats {
  int64_t layer = 0;         // decoder layer index
  int64_t experts = 0;       // E
  at::Tensor frequency;      // [E] f64: routed token slots in the recorded step
  at::Tensor weight_mass;    // [E] f64: sum of the routing weights it received
  at::Tensor coactivation;   // [E, E] f64: tokens that chose both (diagonal: frequency)
  at::Tensor context;        // [E, hidden] f32: mean router input of its calibration tokens (0: none)
  at::Tensor router_rows;    // [E, hidden] f32
  at::Tensor max_activation;  // [E] f64: largest |output| on its calibration tokens
  at::Tensor reap;            // [E] f64: REAP saliency, mean of routing weight x |output| over its tokens
  at::Tensor output_mean;     // [E, hidden] f32: mean output over all calibration tokens (HC-SMoE)
};

// Keeps each MoE layer's router input and choice of a forward pass.
struct RoutingCapture : recorder::RoutingObserver {
  struct Decision {
    at::Tensor hidden, ids, weights;  // [T, h] f32, [T, k], [T, k] f32
  };
  std::map<int64_t, Decision> by_layer;
  void OnRouting(const recorder::RoutingEvent& e) override;
  // The decision of `layer` as a recorded routing entry (micro-batch 0,
  // weights f64 as a bundle holds them).
  RoutingEntry Entry(int64_t layer) const;
};

// The statistics of `moe` with no tokens counted yet: sizes, zero counts and
// its router rows.
LayerStats EmptyStats(moe::MoeLayer& moe);
// Counts one routing decision, `r.ids` [T, k] in [0, E) and `r.weights`
// [T, k] f64 (checked by the caller): frequency, weight mass, co-activation.
void AddRouting(LayerStats& s, const RoutingEntry& r);
// The calibration statistics of `moe` from its router input `d.hidden` and
// choice: routed contexts, output peaks, REAP, mean outputs. Runs every
// expert on every token; `act` is the model's hidden_act (its experts').
void AddCalibration(LayerStats& s, moe::MoeLayer& moe, moe::Activation act, const RoutingCapture::Decision& d);

// `routing`: the step's recorded decisions (ids and weights);
// `calibration` [n, S] int64 token sequences for the forward pass.
absl::StatusOr<std::vector<LayerStats>> CollectStats(const std::vector<RoutingEntry>& routing,
                                                     moe::MoeTransformer& model, const at::Tensor& calibration);

}  // namespace moerr::proxy
