// A model's logits on token ids, its greedy continuation, and its logits
// against reference logits from another framework (`moerr forward`).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "moe/moe_transformer.h"

namespace moerr::moe {

// The forward of `model` on `ids` [B, T] without autograd: logits [B, T, V].
// LibTorch errors come back as a Status.
absl::StatusOr<at::Tensor> Logits(MoeTransformer& model, const at::Tensor& ids);

// `n` greedy tokens after each sequence of `ids`, [B, n] (no cache: the
// whole sequence runs again per token).
absl::StatusOr<at::Tensor> GreedyTokens(MoeTransformer& model, at::Tensor ids, int64_t n);

struct LogitsComparison {
  double max_abs = 0, mean_abs = 0;  // |ours - theirs|, in logit units
  int64_t positions = 0, top1_agree = 0;
  double topk_agreement = 0;  // mean over positions of |ours ∩ theirs| / k
  bool within = false;        // max_abs finite and <= the tolerance
};

// Our `logits` [B, T, V] against `reference` [B, T, V] or [T, V] (any
// floating dtype, compared in fp32), with the top-`top_k` ids' agreement.
// InvalidArgument naming `what` (the reference's file) on a shape or dtype
// that does not fit.
absl::StatusOr<LogitsComparison> CompareLogits(const at::Tensor& logits, at::Tensor reference, int64_t top_k,
                                               double tolerance, const std::string& what);

}  // namespace moerr::moe
