#include "moe/fault.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <map>

#include "absl/strings/str_format.h"
#include "support/check.h"
#include "support/enum_table.h"

namespace moerr::moe {
namespace {

constexpr EnumName<FaultKind> kFaults[] = {
    {FaultKind::kNone, "none"},
    {FaultKind::kExpertOverflow, "expert-overflow"},
    {FaultKind::kGradOverflow, "grad-overflow"},
    {FaultKind::kLogprobPrecision, "logprob-precision"},
    {FaultKind::kBadKernel, "bad-kernel"},
    {FaultKind::kRouterCollapse, "router-collapse"},
    {FaultKind::kSkipUpdate, "skip-update"},
    {FaultKind::kLrDivergence, "lr-divergence"},
    {FaultKind::kRouterCollapseFree, "router-collapse-free"},
    {FaultKind::kLossScaleGrowth, "loss-scale-growth"},
    {FaultKind::kTrainedPrecision, "trained-precision"},
};

// The dynamics faults' settings. lr-divergence: the learning rate's factor
// (1e-4 -> 1: on the tiny preset the first overflow comes 2 to 4 steps in;
// at 1000x the reward collapses but nothing overflows within 10 steps);
// router-collapse-free: the same for the unbalanced routers' drift;
// trained-precision: the experts' activation range, FP6 E2M3's largest value
// (OCP MX formats, here without block scaling). The largest expert
// activation on 64 task sequences is 0.05 for an untrained tiny model and
// 6 to 33 after 100 to 600 warm-up steps (small: 0.26, then 41 to 324).
constexpr double kDivergenceLrFactor = 10000;
constexpr double kCollapseLrFactor = 30;
constexpr double kTrainedActivationMax = 7.5;

// The first MoE layer's most used expert on `calibration`, and the inputs the
// router sent it (rows of hidden states): an overflow there reaches every
// later position through attention, as real ones do.
struct BusiestExpert {
  int64_t layer = 0, expert = 0;
  at::Tensor rows;
};

BusiestExpert FindBusiestExpert(MoeTransformer& policy, const at::Tensor& calibration, const FaultPlace& place) {
  torch::NoGradGuard no_grad;
  struct Capture : recorder::RoutingObserver {
    int64_t layer = 0;
    at::Tensor hidden, topk_ids;
    void OnRouting(const recorder::RoutingEvent& ev) override {
      if (ev.layer == layer) hidden = ev.hidden, topk_ids = ev.topk_ids;
    }
  } capture;
  capture.layer = policy->MoeLayers().front()->gate()->layer();  // the first MoE layer
  policy->SetRoutingObserver(&capture);
  policy->forward(calibration);
  policy->SetRoutingObserver(nullptr);
  BusiestExpert out;
  out.layer = capture.layer;
  const at::Tensor counts = policy->MoeLayers().front()->expert_counts();
  const int64_t first = place.experts < 0 ? 0 : place.first_expert;
  const int64_t n = place.experts < 0 ? counts.size(0) : place.experts;
  out.expert = first + counts.narrow(0, first, n).argmax().item<int64_t>();
  out.rows = capture.hidden.index_select(0, at::where(capture.topk_ids.eq(out.expert).any(1))[0]);
  return out;
}

// The busiest expert's output on the tokens the router sends it on the
// calibration batch: its down projection is scaled so that output lands 8x
// past fp16's range, in the forward pass, and the step runs in fp16
// emulation.
void InjectExpertOverflow(MoeTransformer& policy, GrpoOptions& options, const at::Tensor& calibration,
                          const FaultPlace& place, InjectedFault& out) {
  const MoeConfig& config = policy->config();
  const BusiestExpert busiest = FindBusiestExpert(policy, calibration, place);
  const int64_t layer = busiest.layer, expert = busiest.expert;
  Expert e = policy->MoeLayers().front()->expert(expert);
  const double peak = e->forward(busiest.rows).abs().max().item<double>();
  for (auto& p : e->named_parameters()) {
    if (!place.weights) break;
    if (p.key().find(config.family == Family::kMixtral ? "w2" : "down_proj") != std::string::npos) {
      p.value().mul_(8 * kFp16Max / std::max(peak, 1e-6));
    }
  }
  options.numerics.precision = Precision::kFp16Emu;
  options.rollout_numerics = options.numerics;
  out.module = absl::StrFormat("model.layers.%d.%s.experts.%d", layer, config.MlpName(), expert);
  out.description = absl::StrFormat("%s: down projection scaled so its outputs reach ~8x the fp16 maximum",
                                    out.module);
}

// The naive fp16 softmax fails only where a logit passes ln(fp16 max) ~
// 11.09, as a confident model's do. A policy none of whose logits on the
// calibration batch pass it (a short warm-up) has its final norm's weight
// scaled so the largest lands at 2x that bound: every logit is multiplied by
// that factor (lm_head has no bias), the argmax stays, a max-subtracting
// log_softmax stays finite, and the naive kernel's exp overflows. With the
// fault on one rank, the others run the naive kernel on their own logits.
void InjectBadKernel(MoeTransformer& policy, GrpoOptions& options, const at::Tensor& calibration,
                     const FaultPlace& place, InjectedFault& out) {
  options.naive_fp16_softmax = true;
  out.module = "lm_head";
  out.description = "training log-softmax replaced by a naive fp16 softmax without max subtraction";
  if (!place.weights) return;
  const double bound = std::log(kFp16Max);
  const double peak = policy->forward(calibration).max().item<double>();
  if (peak > bound || peak <= 0) {  // it bites already; or no scale can make it
    out.description += absl::StrFormat("; the largest logit on the calibration batch is %.3g", peak);
    return;
  }
  const double scale = 2 * bound / peak;
  at::Tensor* norm = policy->named_parameters().find("model.norm.weight");
  MOERR_CHECK(norm != nullptr) << "the model has no final norm";
  norm->mul_(scale);
  out.description += absl::StrFormat(
      "; the final norm's weight scaled %.3gx, so the largest logit on the calibration batch, %.3g, is %.3g",
      scale, peak, 2 * bound);
}

// The router aux loss off, and rows 0 and 1 of every router given a large
// copy of the mean direction of that router's inputs (on the calibration
// batch), so nearly every token scores them highest.
void InjectRouterCollapse(MoeTransformer& policy, GrpoOptions& options, const at::Tensor& calibration,
                          const FaultPlace& place, InjectedFault& out) {
  options.aux_loss_coef = 0;
  struct MeanDirection : recorder::RoutingObserver {
    std::map<int64_t, at::Tensor> by_layer;
    void OnRouting(const recorder::RoutingEvent& e) override {
      const at::Tensor unit = e.hidden.to(at::kFloat);
      by_layer[e.layer] = (unit / unit.norm(2, -1, true).clamp_min(1e-12)).mean(0);
    }
  } capture;
  policy->SetRoutingObserver(&capture);
  policy->forward(calibration);
  policy->SetRoutingObserver(nullptr);
  for (MoeLayer& moe : policy->MoeLayers()) {
    if (!place.weights) break;
    const at::Tensor& mean = capture.by_layer.at(moe->gate()->layer());
    const at::Tensor direction = mean / mean.norm().clamp_min(1e-12);
    moe->gate()->weight.narrow(0, 0, 2).add_(direction.unsqueeze(0) * 8.0);
    if (moe->gate()->e_score_correction_bias.defined()) moe->gate()->e_score_correction_bias.narrow(0, 0, 2).add_(10.0);
  }
  out.description = "router aux loss off; experts 0 and 1 favoured by every router";
}

// The dynamics faults (fault.h): options only, no weight is touched.
void InjectDynamicsFault(FaultKind kind, GrpoOptions& options, InjectedFault& out) {
  switch (kind) {
    case FaultKind::kLrDivergence:
      options.numerics.precision = options.rollout_numerics.precision = Precision::kFp16Emu;
      options.lr *= kDivergenceLrFactor;
      out.description = absl::StrFormat("fp16 emulation with a learning rate of %g (%gx): activations grow until "
                                        "they overflow", options.lr, kDivergenceLrFactor);
      break;
    case FaultKind::kRouterCollapseFree:
      options.aux_loss_coef = 0;
      options.lr *= kCollapseLrFactor;
      out.description = absl::StrFormat("router aux loss off, learning rate %g (%gx), no router bias: the load "
                                        "concentrates as training goes", options.lr, kCollapseLrFactor);
      break;
    case FaultKind::kLossScaleGrowth:
      options.numerics.precision = options.rollout_numerics.precision = Precision::kFp16Emu;
      options.scale_growth_interval = 1;
      out.description = absl::StrFormat("fp16 emulation, loss scale %g doubled after every finite step: the "
                                        "scaled gradients overflow once it outgrows them", options.initial_loss_scale);
      break;
    case FaultKind::kTrainedPrecision:
      options.numerics.expert_activation_max = options.rollout_numerics.expert_activation_max = kTrainedActivationMax;
      out.description = absl::StrFormat("the experts' activations held in a format of range %g (FP6 E2M3 "
                                        "without block scaling): +-Inf past it", kTrainedActivationMax);
      break;
    default: MOERR_CHECK(false) << "not a dynamics fault: " << FaultName(kind);
  }
}

}  // namespace

bool OnsetFromDynamics(FaultKind kind) {
  return kind == FaultKind::kLrDivergence || kind == FaultKind::kRouterCollapseFree ||
         kind == FaultKind::kLossScaleGrowth || kind == FaultKind::kTrainedPrecision;
}

absl::StatusOr<FaultKind> ParseFault(const std::string& name) { return ParseEnum(kFaults, "fault", name); }

std::string FaultName(FaultKind kind) { return std::string(EnumNameOf(kFaults, kind)); }

std::vector<FaultKind> AllFaults() {
  std::vector<FaultKind> out;
  for (const EnumName<FaultKind>& f : kFaults) {
    if (f.value != FaultKind::kNone) out.push_back(f.value);
  }
  return out;
}

absl::StatusOr<InjectedFault> InjectFault(FaultKind kind, MoeTransformer& policy, GrpoOptions& options,
                                          const at::Tensor& calibration, const FaultPlace& place) {
  InjectedFault out;
  out.kind = kind;
  torch::NoGradGuard no_grad;
  switch (kind) {
    case FaultKind::kNone: break;
    case FaultKind::kExpertOverflow: InjectExpertOverflow(policy, options, calibration, place, out); break;
    case FaultKind::kGradOverflow: {
      options.numerics.precision = Precision::kFp16Emu;
      options.rollout_numerics.precision = Precision::kFp16Emu;
      options.initial_loss_scale = std::ldexp(1.0, 40);
      out.module = "";
      out.description = "fp16 emulation with an initial loss scale of 2^40: scaled gradients overflow in backward";
      break;
    }
    case FaultKind::kLogprobPrecision: {
      options.rollout_numerics.precision = Precision::kBf16;
      out.description = "rollout log-probs computed in bf16, training log-probs in fp32";
      break;
    }
    case FaultKind::kBadKernel: InjectBadKernel(policy, options, calibration, place, out); break;
    case FaultKind::kRouterCollapse: InjectRouterCollapse(policy, options, calibration, place, out); break;
    case FaultKind::kSkipUpdate: {
      options.skip_update = true;
      out.description = "the optimizer update is silently omitted";
      break;
    }
    case FaultKind::kLrDivergence:
    case FaultKind::kRouterCollapseFree:
    case FaultKind::kLossScaleGrowth:
    case FaultKind::kTrainedPrecision: InjectDynamicsFault(kind, options, out); break;
  }
  return out;
}

}  // namespace moerr::moe
