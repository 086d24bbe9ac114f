// Healthy and faulty RL runs of copies of a model, the measurements
// `moerr proxy-eval` compares an original and its proxies by: metric
// trajectories with what each step trained on, peak tensor memory, a fault's
// response run, and a recorded healthy step.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/fault.h"
#include "moe/grpo_trainer.h"
#include "moe/moe_transformer.h"
#include "moe/step_metrics.h"
#include "proxy/clustering.h"
#include "recorder/hooks/routing_hook.h"

namespace moerr::proxy {

// Records `steps` steps of `trainer` at `path` (replayable, with the state
// model replay needs).
absl::Status RecordSteps(moe::GrpoTrainer& trainer, const std::string& path, int64_t steps);

// One healthy RL step of copies of `warm` (GRPO defaults, trainer seed
// `seed`), recorded replayable at `path`: what a proxy for healthy dynamics
// is built from.
absl::Status RecordHealthyStep(const moe::MoeTransformer& warm, const std::string& path, uint64_t seed = 0);

// Healthy RL steps of copies of `model` (GRPO defaults, `seed`): the metric
// trajectories, what each step trained on, the time and the peak tensor memory.
struct Trajectory {
  std::vector<double> loss, reward, kl, grad_norm;
  std::vector<at::Tensor> responses;  // per step [n, response tokens]
  // Per step, per MoE layer in call order, (ids [T, k], logits [T, E]) of the
  // policy's forwards over the sampled batch (its old log-probs, then its
  // training forward; not the rollout's) and of the reference's; forced ones
  // when replaying.
  using Decisions = std::map<int64_t, std::vector<std::pair<at::Tensor, at::Tensor>>>;
  std::vector<Decisions> policy_routing, reference_routing;
  double seconds = 0;
  int64_t peak_bytes = 0;
};
// `original` (with `plans`, its experts' map onto `model`'s): each step
// replays the original's instead of sampling: its responses, and the policy's
// and the reference's routing forced to the original's, mapped by MapRouting.
Trajectory Train(const moe::MoeTransformer& model, int64_t steps, uint64_t seed, const Trajectory* original = nullptr,
                 const std::vector<LayerPlan>* plans = nullptr);

// Peak tensor memory, bytes, of two healthy RL steps of copies of `model`
// (the second runs with Adam's state allocated) trained in micro-batches of
// `micro_batch` sequences.
int64_t MicroBatchedPeakMemory(const moe::MoeTransformer& model, int64_t micro_batch);

// Healthy RL steps of copies of `model` (GRPO defaults, `seed`), then
// `fault` injected (moe::InjectFault, into the policy as trained so far) and
// `after` more steps under its options, with a fresh optimizer: every
// step's metrics. The post-fault trainer is seeded `seed + 1` (its prompt
// stream differs from the healthy phase's), so the faulty phase of trainer
// seed s samples the same prompts as the healthy phase of trainer seed s + 1:
// runs at consecutive trainer seeds are not independent draws.
absl::StatusOr<std::vector<moe::StepMetrics>> FaultResponseRun(const moe::MoeTransformer& model, moe::FaultKind fault,
                                                               int64_t healthy, int64_t after, uint64_t seed);

// Logs a model's routing decisions into `*step`, per MoE layer in call order,
// in memory outside LibTorch's allocator (a log is not the run's tensor
// memory, which moe::PeakMemoryScope counts).
struct DecisionLog : recorder::RoutingObserver {
  Trajectory::Decisions* step = nullptr;
  void OnRouting(const recorder::RoutingEvent& e) override;
};

}  // namespace moerr::proxy
