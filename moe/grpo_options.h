// The options of a GRPO step (grpo_trainer.h): what a process fault changes
// (fault.h), what a bundle records of the trainer and a replay reads back.
// Apart from the numerics it includes nothing of the model or the trainer, so
// that a fault that changes only the options does not compile them.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "llvm/Support/JSON.h"
#include "moe/numerics.h"

namespace moerr::moe {

struct GrpoOptions {
  int64_t prompts = 8;        // per step
  int64_t group_size = 4;     // responses per prompt
  // Response tokens sampled per sequence; 0: the task's whole answer. Fewer
  // truncate every response (and the reward compares that prefix): `moerr
  // reduce`'s truncate-tokens pass sets it.
  int64_t response_tokens = 0;
  // Sequences per training forward and backward; 0: all of them at once.
  // Gradients accumulate over the micro-batches (the same gradient up to
  // summation order, with the router aux loss taken per micro-batch, as
  // Megatron does), so only one micro-batch's activations are alive: what
  // an RL trainer sets to fit a step into a device's memory.
  int64_t micro_batch = 0;
  double temperature = 1.0;
  double clip_eps = 0.2;
  double kl_coef = 0.05;
  double lr = 1e-4;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;
  double aux_loss_coef = 0.01;
  Numerics numerics;            // training precision
  Numerics rollout_numerics;    // rollout log-prob precision (the logprob-precision fault differs)
  double initial_loss_scale = 65536.0;  // fp16 emulation only
  int64_t scale_growth_interval = 50;   // finite steps before the scale doubles
  // Fault switches (fault.h sets them): naive fp16 softmax in the training
  // log-probs; the optimizer update silently omitted.
  bool naive_fp16_softmax = false;
  bool skip_update = false;
};

// The sequences each forward of a step takes under `options` (all of the
// step's prompts x group_size, or micro_batch of them).
int64_t SequencesPerForward(const GrpoOptions& options);

// Every field, and back; a missing or mistyped field is an error naming it.
llvm::json::Object ToJson(const GrpoOptions& options);
absl::StatusOr<GrpoOptions> GrpoOptionsFromJson(const llvm::json::Object& json);

}  // namespace moerr::moe
