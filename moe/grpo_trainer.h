// One GRPO step of RL post-training on the addition task:
//   rollout   G sampled responses per prompt, their log-probs (old_logp)
//   reward    rule-based; advantages normalised within each group
//   loss      token-level clipped ratio exp(logp - old_logp) against the
//             advantages + kl_coef * k3 KL to the frozen reference
//             (exp(ref - logp) - (ref - logp) - 1) + aux_loss_coef * router
//             load-balancing loss, averaged over response tokens
//   update    AdamW (multi-tensor: foreach_adamw.h) after clipping the
//             gradient norm; under fp16 emulation
//             with dynamic loss scaling: a step whose gradients are not
//             finite is skipped and the scale halved.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"
#include "llvm/Support/JSON.h"

#include "moe/addition_task.h"
#include "moe/foreach_adamw.h"
#include "moe/grpo_options.h"
#include "moe/moe_transformer.h"
#include "moe/numerics.h"
#include "moe/parallel.h"
#include "moe/step_metrics.h"

namespace moerr::moe {

// The response tokens a step samples per sequence under `options`.
int64_t ResponseTokens(const GrpoOptions& options, const AdditionTask& task);

// Everything Step() reads besides the options: a state taken at a step's
// start and restored into a trainer of the same options and model config
// makes that step repeat bitwise. Model replay is built on it.
struct TrainerState {
  // step, seed, loss_scale, good_steps, rng (the batch sampler's
  // std::mt19937_64 as its operator<< writes it), adam_step {NAME: n}.
  llvm::json::Object scalars;
  // "policy/NAME", "reference/NAME", "exp_avg/NAME", "exp_avg_sq/NAME" by the
  // models' HF names. They alias the live tensors: copy them before Step().
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// The tensors a step's loss is computed from, n = prompts x group_size
// sequences of P prompt and A response tokens.
struct StepBatch {
  at::Tensor prompts;     // [n, P] int64
  at::Tensor responses;   // [n, A] int64, sampled in the rollout
  at::Tensor mask;        // [n, A] fp32, 1 up to and including the first EOS
  at::Tensor advantages;  // [n, 1] fp32, group-normalised rewards
  at::Tensor old_logp;    // [n, A] fp32, rollout log-probs
  at::Tensor ref_logp;    // [n, A] fp32, reference-model log-probs
};

class GrpoTrainer {
 public:
  GrpoTrainer(MoeTransformer policy, MoeTransformer reference, AdditionTask task, GrpoOptions options, uint64_t seed);

  StepMetrics Step();

  // Responses [prompts x group_size, response tokens] int64 the next steps
  // train on instead of sampling their own (the prompts come from the
  // trainer's sampler, or its batch source): another model's rollouts, or a
  // recorded world's, replayed. Called once per step with the global batch's
  // prompts, each repeated group_size times [prompts x group_size, P], and
  // gives the global responses (each rank trains on its shard); null: sample.
  using ResponseSource = std::function<at::Tensor(int64_t step, const at::Tensor& prompts)>;
  void set_response_source(ResponseSource source) { response_source_ = std::move(source); }

  // The global batch of the next steps, instead of the sampler's draw: the
  // prompts [options.prompts, P] and their answers (a proxy that keeps some
  // ranks' shards of a recorded batch). Null: sample.
  using BatchSource = std::function<AdditionTask::Batch(int64_t step)>;
  void set_batch_source(BatchSource source) { batch_source_ = std::move(source); }

  // Data and expert parallelism (parallel.h); null: one process. Each rank
  // samples the same global batch and trains on its slice of prompts
  // (rank r: prompts [r*P/N, (r+1)*P/N), whole groups), the rollout drawing
  // from its own generator; a response source is asked for the global
  // batch's responses and sliced the same way. Dense gradients are summed
  // over the world, each expert's over its replicas; the token count, the
  // metrics, the gradient norm and the found-inf flag are world totals, so
  // every rank takes the same clip and skip decisions. Needs prompts % N == 0
  // and micro_batch == 0. Must outlive the trainer's use of it.
  absl::Status set_parallel(Parallel* parallel);
  // What set_parallel requires of `options` and `config` on `layout`, for
  // checking before the model is trained up to that point.
  static absl::Status CheckParallel(const GrpoOptions& options, const MoeConfig& config, const ParallelLayout& layout);

  TrainerState SaveState() const;
  // `tensors` by TrainerState's names. Weights are copied into the models in
  // place (the optimizer keeps its parameters); Adam moments are replaced.
  absl::Status RestoreState(const llvm::json::Object& scalars,
                            const std::map<std::string, formats::TensorView>& tensors);

  MoeTransformer& policy() { return policy_; }
  MoeTransformer& reference() { return reference_; }
  const MoeTransformer& policy() const { return policy_; }
  ForeachAdamW& optimizer() { return *optimizer_; }
  const GrpoOptions& options() const { return options_; }
  double loss_scale() const { return loss_scale_; }
  const StepBatch& last_batch() const { return last_batch_; }  // of the last Step()
  int64_t step() const { return step_; }

 private:
  MoeTransformer policy_, reference_;
  AdditionTask task_;
  GrpoOptions options_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::unique_ptr<ForeachAdamW> optimizer_;  // over policy_->parameters(), in that order
  double loss_scale_;
  StepBatch last_batch_;
  ResponseSource response_source_;
  BatchSource batch_source_;
  Parallel* parallel_ = nullptr;
  int64_t good_steps_ = 0;
  int64_t step_ = 0;

  // Step()'s parts, in order: the rollout (this rank's sampled, scored
  // batch; `inputs` [n, P + A - 1], `rewards` [n]), the loss, its metrics and
  // gradients, and the optimizer step or the skip.
  StepBatch Rollout(at::Tensor& inputs, at::Tensor& rewards);
  void Backward(const at::Tensor& inputs, const at::Tensor& rewards, StepMetrics& m);
  void Update(StepMetrics& m);
  int64_t LocalSequences() const;  // this rank's sequences: n = prompts x group_size / world size
  at::Tensor Shard(const at::Tensor& t) const;  // this rank's rows of a global [n, ...] batch tensor
  void SyncGradients();
  double GradNorm(const std::vector<at::Tensor>& grads);  // the world's L2 norm of the gradients
};

}  // namespace moerr::moe
