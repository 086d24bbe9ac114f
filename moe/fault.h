// A process fault of the catalogue (moe/faults/fault_table.h, one row per
// fault) injected into the reference trainer: its row's mechanism changes the
// policy's weights and the step options so a training step fails the way
// users meet it in RL post-training of MoE models.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "moe/faults/fault_table.h"
#include "moe/grpo_options.h"

namespace moerr::moe {

// moe_transformer.h: a fault that changes weights includes it. The policy is
// only passed by reference here, so the model's LibTorch modules stay out of
// every file that names a fault.
class MoeTransformer;

struct InjectedFault {
  FaultKind kind = FaultKind::kNone;
  std::string module;       // the module the fault was put in, if any ("model.layers.3.mlp.experts.5")
  std::string description;  // one line for people
};

// Where a fault goes when only one rank of a world has it (`moerr train
// --fault-rank K`, a row with `in_weights`): every rank applies what the
// ranks share (numerics, options), only rank K changes its weights, and
// expert-overflow breaks one of the experts rank K hosts.
struct FaultPlace {
  int64_t first_expert = 0, experts = -1;  // the experts expert-overflow chooses from; -1: all
  bool weights = true;                     // change this process's weights
};

// What a process fault's mechanism (FaultRow::inject) changes, and where it
// says what it did (`out.module`, `out.description`). Gradients are off.
struct FaultSite {
  MoeTransformer& policy;
  GrpoOptions& options;
  const at::Tensor& calibration;  // [n, S] tokens, whole sequences as training sees them
  const FaultPlace& place;
  InjectedFault& out;
};

// Applies `kind` (a process fault, or kNone) to the policy's weights and the
// step options. `calibration` picks what a fault breaks so that it is
// reached (expert-overflow: the most used expert in the first MoE layer of
// those `place` allows). A rank fault is InvalidArgument: it is an observer of
// a rank (moe/faults/rank_fault.h), not a change to one process.
absl::StatusOr<InjectedFault> InjectFault(FaultKind kind, MoeTransformer& policy, GrpoOptions& options,
                                          const at::Tensor& calibration, const FaultPlace& place = {});

}  // namespace moerr::moe
