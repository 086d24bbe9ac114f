// lr-divergence (a dynamics fault): fp16 emulation and a learning rate 10^4x
// too high: weights and activations grow step by step until one overflows
// fp16. Options only; no weight is touched.
#include "absl/strings/str_format.h"
#include "moe/fault.h"

namespace moerr::moe {
namespace {

// 1e-4 -> 1: on the tiny preset the first overflow comes 2 to 4 steps in; at
// 1000x the reward collapses but nothing overflows within 10 steps.
constexpr double kDivergenceLrFactor = 10000;

void Inject(FaultSite& s) {
  s.options.numerics.precision = s.options.rollout_numerics.precision = Precision::kFp16Emu;
  s.options.lr *= kDivergenceLrFactor;
  s.out.description = absl::StrFormat(
      "fp16 emulation with a learning rate of %g (%gx): activations grow until they overflow", s.options.lr,
      kDivergenceLrFactor);
}

constexpr FaultRow kRow{
    FaultKind::kLrDivergence, "lr-divergence", FaultScope::kProcess,
    "fp16 emulation and a learning rate 10^4x too high (1): weights and activations grow step by step until one "
    "overflows fp16",
    /*failure=*/"overflow", /*rule=*/"overflow", /*verdict=*/"the first overflow, steps after injection",
    /*dynamics=*/true, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& LrDivergenceFault() { return kRow; }

}  // namespace moerr::moe
