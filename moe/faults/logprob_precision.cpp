// logprob-precision: rollout log-probs in bf16, training in fp32, so the
// importance ratio drifts from 1 on-policy.
#include "moe/fault.h"

namespace moerr::moe {
namespace {

void Inject(FaultSite& s) {
  s.options.rollout_numerics.precision = Precision::kBf16;
  s.out.description = "rollout log-probs computed in bf16, training log-probs in fp32";
}

constexpr FaultRow kRow{
    FaultKind::kLogprobPrecision, "logprob-precision", FaultScope::kProcess,
    "rollout log-probs in bf16, training in fp32: the ratio drifts from 1 on-policy",
    /*failure=*/"hazardous-patterns", /*rule=*/"mixed-autocast",
    /*verdict=*/"hazardous-patterns' mixed autocast dtypes",
    /*dynamics=*/false, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& LogprobPrecisionFault() { return kRow; }

}  // namespace moerr::moe
