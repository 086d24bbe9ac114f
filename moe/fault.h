// The fault catalogue: each fault makes a training step fail the way users
// meet it in RL post-training of MoE models.
//
//   expert-overflow    one expert's weights make its activations exceed the
//                      fp16 range (forces fp16 emulation)
//   grad-overflow      an oversized loss scale: loss-scaled gradients
//                      overflow in backward (forces fp16 emulation)
//   logprob-precision  rollout log-probs in bf16, training in fp32: the
//                      ratio drifts from 1 on-policy
//   bad-kernel         the training log-softmax is a naive fp16 softmax
//                      without max subtraction: NaN once a logit > ~11.09
//                      (a policy whose logits stay below that has its final
//                      norm scaled so they pass it, as a confident model's do)
//   router-collapse    aux loss off and routers biased to two experts:
//                      load collapses
//   skip-update        the optimizer update is silently omitted
//
// Faults whose onset comes from the model's own training dynamics, some steps
// after injection, not from one broken part (OnsetFromDynamics):
//   lr-divergence        fp16 emulation and a learning rate 10^4x too high
//                        (1): weights and activations grow step by step
//                        until one overflows fp16
//   router-collapse-free the aux loss off (no router bias) and a raised
//                        learning rate: the routers' rich-get-richer dynamics
//                        concentrate the load
//   loss-scale-growth    fp16 emulation whose loss scale doubles after every
//                        finite step until the scaled gradients overflow
//   trained-precision    the experts' activations held in a narrow format
//                        (Numerics::expert_activation_max): fresh experts stay
//                        inside its range, trained ones leave it
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/grpo_trainer.h"

namespace moerr::moe {

enum class FaultKind {
  kNone,
  kExpertOverflow,
  kGradOverflow,
  kLogprobPrecision,
  kBadKernel,
  kRouterCollapse,
  kSkipUpdate,
  kLrDivergence,
  kRouterCollapseFree,
  kLossScaleGrowth,
  kTrainedPrecision,
};

absl::StatusOr<FaultKind> ParseFault(const std::string& name);
std::string FaultName(FaultKind kind);
std::vector<FaultKind> AllFaults();
// Whether `kind`'s failure first shows steps after injection, when training
// has moved the model there (the dynamics faults above), rather than at once.
bool OnsetFromDynamics(FaultKind kind);

struct InjectedFault {
  FaultKind kind = FaultKind::kNone;
  std::string module;       // the module the fault was put in, if any ("model.layers.3.mlp.experts.5")
  std::string description;  // one line for people
};

// Where a fault goes when only one rank of a world has it (`moerr train
// --fault-rank K`): every rank applies what the ranks share (numerics,
// options), only rank K changes its weights, and expert-overflow breaks one
// of the experts rank K hosts.
struct FaultPlace {
  int64_t first_expert = 0, experts = -1;  // the experts expert-overflow chooses from; -1: all
  bool weights = true;                     // change this process's weights
};

// Applies `kind` to the policy's weights and the step options. `calibration`
// [n, S] tokens (whole sequences, as training sees them) pick the expert to
// break: the most used one in the first MoE layer (of those `place` allows),
// so the fault is reached.
absl::StatusOr<InjectedFault> InjectFault(FaultKind kind, MoeTransformer& policy, GrpoOptions& options,
                                          const at::Tensor& calibration, const FaultPlace& place = {});

}  // namespace moerr::moe
