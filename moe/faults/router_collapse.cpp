// router-collapse: the router aux loss off and every router biased to
// experts 0 and 1: the load collapses onto them.
#include <torch/torch.h>

#include <map>

#include "moe/fault.h"
#include "moe/moe_transformer.h"

namespace moerr::moe {
namespace {

// Rows 0 and 1 of every router get a large copy of the mean direction of
// that router's inputs (on the calibration batch), so nearly every token
// scores them highest.
void Inject(FaultSite& s) {
  s.options.aux_loss_coef = 0;
  struct MeanDirection : recorder::RoutingObserver {
    std::map<int64_t, at::Tensor> by_layer;
    void OnRouting(const recorder::RoutingEvent& e) override {
      const at::Tensor unit = e.hidden.to(at::kFloat);
      by_layer[e.layer] = (unit / unit.norm(2, -1, true).clamp_min(1e-12)).mean(0);
    }
  } capture;
  s.policy->SetRoutingObserver(&capture);
  s.policy->forward(s.calibration);
  s.policy->SetRoutingObserver(nullptr);
  for (MoeLayer& moe : s.policy->MoeLayers()) {
    if (!s.place.weights) break;
    const at::Tensor& mean = capture.by_layer.at(moe->gate()->layer());
    const at::Tensor direction = mean / mean.norm().clamp_min(1e-12);
    moe->gate()->weight.narrow(0, 0, 2).add_(direction.unsqueeze(0) * 8.0);
    if (moe->gate()->e_score_correction_bias.defined()) moe->gate()->e_score_correction_bias.narrow(0, 0, 2).add_(10.0);
  }
  s.out.description = "router aux loss off; experts 0 and 1 favoured by every router";
}

constexpr FaultRow kRow{
    FaultKind::kRouterCollapse, "router-collapse", FaultScope::kProcess,
    "aux loss off and routers biased to two experts: load collapses",
    /*failure=*/"load-imbalance", /*rule=*/"load-imbalance",
    /*verdict=*/"load-imbalance: the busiest expert's share of the slots",
    /*dynamics=*/false, /*in_weights=*/true, Inject, nullptr};

}  // namespace

const FaultRow& RouterCollapseFault() { return kRow; }

}  // namespace moerr::moe
