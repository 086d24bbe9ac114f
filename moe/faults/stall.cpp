// stall: rank K stops for good in step 0 (as the step starts or, with @N,
// before its N-th collective of the step after the rollout), so the others
// wait in the collective they share with it next until it times out.
#include <unistd.h>

#include "moe/faults/rank_fault.h"

namespace moerr::moe {
namespace {

void StopForGood() {
  for (;;) ::pause();
}

std::unique_ptr<TrainObserver> Observe(const RankFaultSpec& spec, Parallel* parallel) {
  return MakeStopFault(spec, parallel, StopForGood);
}

constexpr FaultRow kRow{
    FaultKind::kStall, "stall", FaultScope::kRanks, "rank K stops there, the others time out in their collective",
    /*failure=*/"", /*rule=*/"",
    /*verdict=*/"the others waited: `moerr inspect RUN` names the collective each timed out in (kind, sequence "
    "number, module); the launcher stopped the stalled rank",
    /*dynamics=*/false, /*in_weights=*/false, nullptr, Observe};

}  // namespace

const FaultRow& StallFault() { return kRow; }

}  // namespace moerr::moe
