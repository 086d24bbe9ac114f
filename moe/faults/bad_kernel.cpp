// bad-kernel: the training log-softmax is a naive fp16 softmax without max
// subtraction: NaN once a logit passes ln(fp16 max) ~ 11.09. A policy whose
// logits stay below that has its final norm scaled so they pass it, as a
// confident model's do.
#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_format.h"
#include "moe/fault.h"
#include "moe/moe_transformer.h"
#include "support/check.h"

namespace moerr::moe {
namespace {

// A policy none of whose logits on the calibration batch pass the bound (a
// short warm-up) has its final norm's weight scaled so the largest lands at
// 2x it: every logit is multiplied by that factor (lm_head has no bias), the
// argmax stays, a max-subtracting log_softmax stays finite, and the naive
// kernel's exp overflows. With the fault on one rank, the others run the
// naive kernel on their own logits.
void Inject(FaultSite& s) {
  s.options.naive_fp16_softmax = true;
  s.out.module = "lm_head";
  s.out.description = "training log-softmax replaced by a naive fp16 softmax without max subtraction";
  if (!s.place.weights) return;
  const double bound = std::log(kFp16Max);
  const double peak = s.policy->forward(s.calibration).max().item<double>();
  if (peak > bound || peak <= 0) {  // it bites already; or no scale can make it
    s.out.description += absl::StrFormat("; the largest logit on the calibration batch is %.3g", peak);
    return;
  }
  const double scale = 2 * bound / peak;
  at::Tensor* norm = s.policy->named_parameters().find("model.norm.weight");
  MOERR_CHECK(norm != nullptr) << "the model has no final norm";
  norm->mul_(scale);
  s.out.description += absl::StrFormat(
      "; the final norm's weight scaled %.3gx, so the largest logit on the calibration batch, %.3g, is %.3g",
      scale, peak, 2 * bound);
}

constexpr FaultRow kRow{
    FaultKind::kBadKernel, "bad-kernel", FaultScope::kProcess,
    "the training log-softmax is a naive fp16 softmax without max subtraction: NaN once a logit > ~11.09 (a "
    "policy whose logits stay below that has its final norm scaled so they pass it)",
    /*failure=*/"hazardous-patterns", /*rule=*/"exp-range",
    /*verdict=*/"hazardous-patterns' exp past its dtype's range",
    /*dynamics=*/false, /*in_weights=*/true, Inject, nullptr};

}  // namespace

const FaultRow& BadKernelFault() { return kRow; }

}  // namespace moerr::moe
