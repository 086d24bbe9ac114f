// The original model under weight noise of a chosen size: the yardstick a
// proxy is judged beside (docs/PROXY.md, "Measuring them"). A proxy at logit
// KL K is compared with what any perturbation of the original at KL K does.
//
//   const at::Tensor tokens = ...;  // [B, S] int64, e.g. proxy-eval's held-out batch
//   MOERR_ASSIGN_OR_RETURN(MatchedNoise m, MatchNoiseToKl(warm, tokens, row.logit_kl, /*seed=*/0));
//   Trajectory t = Train(m.model, steps, 5);  // m.rel, m.kl: the noise and the KL reached
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "moe/moe_transformer.h"

namespace moerr::proxy {

// A copy of `model` with every parameter tensor p plus independent Gaussian
// noise of standard deviation rel * rms(p), drawn from a CPU generator of
// `seed` (the same seed gives the same noise direction at every rel).
// rel = 0 is a bitwise copy. rel must be finite and >= 0.
moe::MoeTransformer Perturbed(const moe::MoeTransformer& model, double rel, uint64_t seed);

// KL(original || other) of the next-token distributions per token, in nats:
// the mean over every position of logits [B, S, vocab] of
// sum_v p_o(v) (log p_o(v) - log p_x(v)), computed in double.
double LogitKl(const at::Tensor& original_logits, const at::Tensor& other_logits);
// The same of two models' forwards on `tokens` [B, S] int64 (no gradients).
double LogitKl(moe::MoeTransformer& original, moe::MoeTransformer& other, const at::Tensor& tokens);

struct MatchOptions {
  // Accepted when target / factor <= KL <= target * factor.
  double factor = 1.25;
  // Forwards of perturbed models at most (the original's one not counted).
  int64_t max_tries = 12;
};

struct MatchedNoise {
  double rel = 0;   // the noise, in units of each tensor's rms
  double kl = 0;    // LogitKl(model, Perturbed(model, rel, seed), tokens)
  int64_t tries = 0;  // perturbed forwards it took
  moe::MoeTransformer model{nullptr};  // Perturbed(model, rel, seed)
};

// The rel at which Perturbed(model, rel, seed) has logit KL within
// options.factor of `target_kl` on `tokens`. KL grows about as rel^2, so it
// starts at rel = sqrt(target_kl), extrapolates with slope 2 in log-log until
// the target is bracketed, then bisects log(rel), each guess interpolated
// between the bracket's ends in log-log and kept off them. InvalidArgument
// for a target <= 0 or not finite, a factor <= 1, or no tokens;
// FailedPrecondition when the KL saturates below the target (it names the
// largest KL reached) or the tries run out (the nearest KL).
absl::StatusOr<MatchedNoise> MatchNoiseToKl(const moe::MoeTransformer& model, const at::Tensor& tokens,
                                            double target_kl, uint64_t seed, const MatchOptions& options = {});

}  // namespace moerr::proxy
