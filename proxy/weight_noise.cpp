#include "proxy/weight_noise.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_format.h"
#include "support/check.h"

namespace moerr::proxy {
namespace {

// Per-position log-probabilities [B, S, vocab] in double.
at::Tensor LogProbs(const at::Tensor& logits) { return at::log_softmax(logits.to(at::kDouble), -1); }

double KlOfLogProbs(const at::Tensor& lo, const at::Tensor& lp) {
  return (lo.exp() * (lo - lp)).sum(-1).mean().item<double>();
}

at::Tensor ForwardLogits(moe::MoeTransformer model, const at::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  return model->Forward(tokens, false).logits;
}

// The largest step in log(rel) one guess may take (a factor 1000 in rel), and
// the largest rel tried: noise 1000x each tensor's rms leaves nothing of the
// weights, so a KL still below the target there has saturated.
constexpr double kMaxLogStep = 6.907755278982137;  // log(1000)
constexpr double kMaxRel = 1e3;

// One perturbed forward: its log(rel) and KL (Inf when not finite, which is
// past any target).
struct Probe {
  double log_rel = 0, kl = 0;
};

// The next log(rel) to try. `lo`: the largest tried below the target; `hi`:
// the smallest above it.
double NextLogRel(const std::optional<Probe>& lo, const std::optional<Probe>& hi, double log_target) {
  if (lo && hi) {  // bracketed: interpolate in log-log, kept 10% off either end
    double t = 0.5;
    if (std::isfinite(hi->kl) && lo->kl > 0) t = (log_target - std::log(lo->kl)) / (std::log(hi->kl) - std::log(lo->kl));
    t = std::clamp(t, 0.1, 0.9);
    return lo->log_rel + t * (hi->log_rel - lo->log_rel);
  }
  const Probe& p = lo ? *lo : *hi;
  // KL ~ rel^2: half the log distance to the target; a KL of 0 or Inf gives
  // no slope, so the largest step.
  double step = lo ? kMaxLogStep : -kMaxLogStep;
  if (p.kl > 0 && std::isfinite(p.kl)) step = (log_target - std::log(p.kl)) / 2;
  return p.log_rel + std::clamp(step, -kMaxLogStep, kMaxLogStep);
}

}  // namespace

moe::MoeTransformer Perturbed(const moe::MoeTransformer& model, double rel, uint64_t seed) {
  MOERR_CHECK(std::isfinite(rel) && rel >= 0) << "weight noise of " << rel << " x rms";
  moe::MoeTransformer out = moe::CopyOf(model);
  if (rel == 0) return out;  // adding zeros would turn -0.0 into +0.0
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (at::Tensor& p : out->parameters()) {
    const double rms = p.to(at::kDouble).pow(2).mean().sqrt().item<double>();
    p.add_(at::randn(p.sizes(), gen, p.options()) * (rel * rms));
  }
  return out;
}

double LogitKl(const at::Tensor& original_logits, const at::Tensor& other_logits) {
  MOERR_CHECK(original_logits.sizes() == other_logits.sizes()) << "logits of other shapes";
  return KlOfLogProbs(LogProbs(original_logits), LogProbs(other_logits));
}

double LogitKl(moe::MoeTransformer& original, moe::MoeTransformer& other, const at::Tensor& tokens) {
  return LogitKl(ForwardLogits(original, tokens), ForwardLogits(other, tokens));
}

absl::StatusOr<MatchedNoise> MatchNoiseToKl(const moe::MoeTransformer& model, const at::Tensor& tokens,
                                            double target_kl, uint64_t seed, const MatchOptions& options) {
  if (!std::isfinite(target_kl) || target_kl <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("a target logit KL must be finite and > 0, not %g", target_kl));
  }
  if (!(options.factor > 1) || options.max_tries < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("matching within a factor %g in %d tries: needs a factor > 1 "
                                                      "and a try", options.factor, options.max_tries));
  }
  if (!tokens.defined() || tokens.dim() != 2 || tokens.numel() == 0) {
    return absl::InvalidArgumentError("matching weight noise to a logit KL needs a [B, S] token batch");
  }
  const at::Tensor original = LogProbs(ForwardLogits(model, tokens));
  const double log_target = std::log(target_kl), tolerance = std::log(options.factor);
  std::optional<Probe> lo, hi, nearest;
  double largest = 0;  // finite KL
  const double log_max_rel = std::log(kMaxRel);
  // KL ~ rel^2 with a coefficient of about 1; never above kMaxRel.
  double log_rel = std::min(log_target / 2, log_max_rel);
  for (int64_t tries = 1; tries <= options.max_tries; ++tries) {
    const double rel = std::exp(log_rel);
    moe::MoeTransformer perturbed = Perturbed(model, rel, seed);
    double kl = KlOfLogProbs(original, LogProbs(ForwardLogits(perturbed, tokens)));
    if (!std::isfinite(kl)) kl = INFINITY;
    const Probe p{log_rel, kl};
    const double miss = kl > 0 ? std::abs(std::log(kl) - log_target) : INFINITY;
    if (miss <= tolerance) return MatchedNoise{rel, kl, tries, std::move(perturbed)};
    if (std::isfinite(kl)) largest = std::max(largest, kl);
    if (!nearest || miss < std::abs(std::log(nearest->kl) - log_target)) nearest = p;
    if (kl < target_kl) {
      if (!lo || log_rel > lo->log_rel) lo = p;
    } else if (!hi || log_rel < hi->log_rel) {
      hi = p;
    }
    // On log_rel, not rel: exp(log(kMaxRel)) may round below kMaxRel.
    if (!hi && log_rel >= log_max_rel) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "weight noise cannot reach logit KL %g: it saturates, the largest reached %g (noise up to %g x rms)",
          target_kl, largest, rel));
    }
    log_rel = std::min(NextLogRel(lo, hi, log_target), log_max_rel);
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "weight noise did not reach logit KL %g within %gx in %d tries: the nearest was %g at %g x rms", target_kl,
      options.factor, options.max_tries, nearest ? nearest->kl : NAN, nearest ? std::exp(nearest->log_rel) : NAN));
}

}  // namespace moerr::proxy
