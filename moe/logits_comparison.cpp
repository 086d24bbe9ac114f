#include "moe/logits_comparison.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::moe {
absl::StatusOr<at::Tensor> Logits(MoeTransformer& model, const at::Tensor& ids) {
  at::Tensor logits;
  MOERR_RETURN_IF_ERROR(CatchTorch("forward", [&] {
    at::NoGradGuard no_grad;
    logits = model->forward(ids);
    return absl::OkStatus();
  }));
  return logits;
}

absl::StatusOr<at::Tensor> GreedyTokens(MoeTransformer& model, at::Tensor ids, int64_t n) {
  at::Tensor out = at::empty({ids.size(0), 0}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    MOERR_ASSIGN_OR_RETURN(const at::Tensor logits, Logits(model, ids));
    const at::Tensor next = logits.select(1, -1).argmax(-1).unsqueeze(1);
    ids = at::cat({ids, next}, 1);
    out = at::cat({out, next}, 1);
  }
  return out;
}

absl::StatusOr<LogitsComparison> CompareLogits(const at::Tensor& logits, at::Tensor reference, int64_t top_k,
                                               double tolerance, const std::string& what) {
  if (!at::isFloatingType(reference.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: logits is %s, not a floating-point tensor", what,
                                                      c10::toString(reference.scalar_type())));
  }
  if (reference.dim() == 2) reference = reference.unsqueeze(0);
  if (!reference.sizes().equals(logits.sizes())) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: logits has shape %s; the forward gives %s", what,
                                                      recorder::ShapeText(reference), recorder::ShapeText(logits)));
  }
  reference = reference.to(at::kFloat);
  LogitsComparison c;
  const at::Tensor diff = (logits - reference).abs();
  c.max_abs = diff.max().item<double>();
  c.mean_abs = diff.mean().item<double>();
  const int64_t vocab = logits.size(-1), k = std::min(top_k, vocab);
  const at::Tensor ours = logits.reshape({-1, vocab}), theirs = reference.reshape({-1, vocab});
  c.positions = ours.size(0);
  c.top1_agree = ours.argmax(-1).eq(theirs.argmax(-1)).sum().item<int64_t>();
  const at::Tensor a = std::get<1>(ours.topk(k, -1)), b = std::get<1>(theirs.topk(k, -1));
  const at::Tensor overlap = a.unsqueeze(-1).eq(b.unsqueeze(-2)).any(-1).sum(-1).to(at::kDouble);
  c.topk_agreement = (overlap / static_cast<double>(k)).mean().item<double>();
  c.within = std::isfinite(c.max_abs) && c.max_abs <= tolerance;
  return c;
}

}  // namespace moerr::moe
