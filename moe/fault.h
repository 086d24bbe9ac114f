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
//   router-collapse    aux loss off and routers biased to two experts:
//                      load collapses
//   skip-update        the optimizer update is silently omitted
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/grpo_trainer.h"

namespace moerr::moe {

enum class FaultKind { kNone, kExpertOverflow, kGradOverflow, kLogprobPrecision, kBadKernel, kRouterCollapse, kSkipUpdate };

absl::StatusOr<FaultKind> ParseFault(const std::string& name);
std::string FaultName(FaultKind kind);
std::vector<FaultKind> AllFaults();

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
