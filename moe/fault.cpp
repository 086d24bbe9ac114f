#include "moe/fault.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_format.h"

namespace moerr::moe {

absl::StatusOr<InjectedFault> InjectFault(FaultKind kind, MoeTransformer& policy, GrpoOptions& options,
                                          const at::Tensor& calibration, const FaultPlace& place) {
  InjectedFault out;
  out.kind = kind;
  if (kind == FaultKind::kNone) return out;
  const FaultRow& row = FaultRowOf(kind);
  if (row.scope != FaultScope::kProcess) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is a fault of a rank of a run (--rank-fault), not of one process's training", row.name));
  }
  torch::NoGradGuard no_grad;
  FaultSite site{policy, options, calibration, place, out};
  row.inject(site);
  return out;
}

}  // namespace moerr::moe
