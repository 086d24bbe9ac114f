// grad-overflow: an oversized loss scale, so the loss-scaled gradients
// overflow in backward (forces fp16 emulation).
#include <cmath>

#include "moe/fault.h"

namespace moerr::moe {
namespace {

void Inject(FaultSite& s) {
  s.options.numerics.precision = Precision::kFp16Emu;
  s.options.rollout_numerics.precision = Precision::kFp16Emu;
  s.options.initial_loss_scale = std::ldexp(1.0, 40);
  s.out.description = "fp16 emulation with an initial loss scale of 2^40: scaled gradients overflow in backward";
}

constexpr FaultRow kRow{
    FaultKind::kGradOverflow, "grad-overflow", FaultScope::kProcess,
    "an oversized loss scale: loss-scaled gradients overflow in backward (forces fp16 emulation)",
    /*failure=*/"overflow", /*rule=*/"overflow", /*verdict=*/"the first overflow (backward)",
    /*dynamics=*/false, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& GradOverflowFault() { return kRow; }

}  // namespace moerr::moe
