// trained-precision (a dynamics fault): the experts' activations held in a
// narrow format (Numerics::expert_activation_max): fresh experts stay
// inside its range, trained ones leave it. Options only; no weight is
// touched.
#include "absl/strings/str_format.h"
#include "moe/fault.h"

namespace moerr::moe {
namespace {

// The experts' activation range: FP6 E2M3's largest value (OCP MX formats,
// here without block scaling). The largest expert activation on 64 task
// sequences is 0.05 for an untrained tiny model and 6 to 33 after 100 to
// 600 warm-up steps (small: 0.26, then 41 to 324).
constexpr double kTrainedActivationMax = 7.5;

void Inject(FaultSite& s) {
  s.options.numerics.expert_activation_max = s.options.rollout_numerics.expert_activation_max =
      kTrainedActivationMax;
  s.out.description = absl::StrFormat(
      "the experts' activations held in a format of range %g (FP6 E2M3 without block scaling): +-Inf past it",
      kTrainedActivationMax);
}

constexpr FaultRow kRow{
    FaultKind::kTrainedPrecision, "trained-precision", FaultScope::kProcess,
    "the experts' activations held in a narrow format (Numerics::expert_activation_max): fresh experts stay "
    "inside its range, trained ones leave it",
    /*failure=*/"overflow", /*rule=*/"overflow",
    /*verdict=*/"the first overflow, in an expert, once training has grown its activations",
    /*dynamics=*/true, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& TrainedPrecisionFault() { return kRow; }

}  // namespace moerr::moe
