// loss-scale-growth (a dynamics fault): fp16 emulation whose loss scale
// doubles after every finite step until the scaled gradients overflow.
// Options only; no weight is touched.
#include "absl/strings/str_format.h"
#include "moe/fault.h"

namespace moerr::moe {
namespace {

void Inject(FaultSite& s) {
  s.options.numerics.precision = s.options.rollout_numerics.precision = Precision::kFp16Emu;
  s.options.scale_growth_interval = 1;
  s.out.description = absl::StrFormat(
      "fp16 emulation, loss scale %g doubled after every finite step: the scaled gradients overflow once it "
      "outgrows them",
      s.options.initial_loss_scale);
}

constexpr FaultRow kRow{
    FaultKind::kLossScaleGrowth, "loss-scale-growth", FaultScope::kProcess,
    "fp16 emulation whose loss scale doubles after every finite step until the scaled gradients overflow",
    /*failure=*/"overflow", /*rule=*/"overflow", /*verdict=*/"the first overflow (backward), steps after injection",
    /*dynamics=*/true, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& LossScaleGrowthFault() { return kRow; }

}  // namespace moerr::moe
