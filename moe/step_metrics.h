// What one GRPO step (grpo_trainer.h) measured: plain numbers, so that a
// replay's report carries them without including the model.
#pragma once

#include <cstdint>

namespace moerr::moe {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double reward = 0;          // mean over responses
  double kl = 0;              // mean k3 KL to the reference over response tokens
  double grad_norm = 0;       // before clipping (unscaled); NaN/Inf when not finite
  double loss_scale = 1;
  double load_entropy = 0;    // mean over MoE layers of H(expert load) / log(E), in [0, 1]
  double top_expert_share = 0;  // mean over MoE layers of the busiest expert's share of routed slots
  double clip_fraction = 0;   // response tokens whose ratio was clipped
  double ratio_error = 0;     // mean |ratio - 1| at the step's start (on-policy: 0)
  bool skipped = false;       // no update was applied (non-finite gradients)
  bool finite = true;         // loss and gradients finite
};

}  // namespace moerr::moe
