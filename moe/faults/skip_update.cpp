// skip-update: the optimizer update is silently omitted.
#include "moe/fault.h"

namespace moerr::moe {
namespace {

void Inject(FaultSite& s) {
  s.options.skip_update = true;
  s.out.description = "the optimizer update is silently omitted";
}

constexpr FaultRow kRow{
    FaultKind::kSkipUpdate, "skip-update", FaultScope::kProcess, "the optimizer update is silently omitted",
    /*failure=*/"optimizer-hazards", /*rule=*/"lost-update",
    /*verdict=*/"optimizer-hazards' lost update (not its loss-scaler skip or Adam's eps)",
    /*dynamics=*/false, /*in_weights=*/false, Inject, nullptr};

}  // namespace

const FaultRow& SkipUpdateFault() { return kRow; }

}  // namespace moerr::moe
