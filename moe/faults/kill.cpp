// kill: rank K SIGKILLs itself in step 0, as the step starts or, with @N,
// before its N-th collective of the step after the rollout; the others fail
// the collective they share with it next.
#include <signal.h>

#include "moe/faults/rank_fault.h"

namespace moerr::moe {
namespace {

void KillSelf() { ::raise(SIGKILL); }

std::unique_ptr<TrainObserver> Observe(const RankFaultSpec& spec, Parallel* parallel) {
  return MakeStopFault(spec, parallel, KillSelf);
}

constexpr FaultRow kRow{
    FaultKind::kKill, "kill", FaultScope::kRanks, "rank K is killed by SIGKILL as the step starts",
    /*failure=*/"", /*rule=*/"",
    /*verdict=*/"the rank died: `moerr inspect RUN` names it and the op its bundle ends after; the others waited in "
    "the collective they shared with it next",
    /*dynamics=*/false, /*in_weights=*/false, nullptr, Observe};

}  // namespace

const FaultRow& KillFault() { return kRow; }

}  // namespace moerr::moe
