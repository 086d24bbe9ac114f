// router-collapse-free (a dynamics fault): the aux loss off (no router bias)
// and a raised learning rate: the routers' rich-get-richer dynamics
// concentrate the load. Options only; no weight is touched.
#include "absl/strings/str_format.h"
#include "moe/fault.h"

namespace moerr::moe {
namespace {

// The learning rate's factor for the unbalanced routers' drift.
constexpr double kCollapseLrFactor = 30;

void Inject(FaultSite& s) {
  s.options.aux_loss_coef = 0;
  s.options.lr *= kCollapseLrFactor;
  s.out.description = absl::StrFormat(
      "router aux loss off, learning rate %g (%gx), no router bias: the load concentrates as training goes",
      s.options.lr, kCollapseLrFactor);
}

constexpr FaultRow kRow{
    FaultKind::kRouterCollapseFree, "router-collapse-free", FaultScope::kProcess,
    "the aux loss off (no router bias) and a raised learning rate: the routers' rich-get-richer dynamics "
    "concentrate the load",
    /*failure=*/"load-imbalance", /*rule=*/"load-imbalance",
    /*verdict=*/"load-imbalance, steps after injection",
    /*dynamics=*/true, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& RouterCollapseFreeFault() { return kRow; }

}  // namespace moerr::moe
