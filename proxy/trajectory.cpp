#include "proxy/trajectory.h"

#include <ATen/record_function.h>

#include <chrono>
#include <cstring>
#include <random>

#include "moe/peak_memory.h"
#include "proxy/surgery.h"
#include "recorder/recorder.h"
#include "replayer/model_replay.h"
#include "support/check.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

using Clock = std::chrono::steady_clock;

// A copy of `t` in memory of its own, not from LibTorch's allocator: a log
// is not the run's tensor memory (PeakMemoryScope counts that).
at::Tensor UncountedCopy(const at::Tensor& t) {
  if (!t.defined()) return t;
  const at::Tensor c = t.detach().contiguous();
  auto* bytes = new std::vector<char>(c.nbytes());
  std::memcpy(bytes->data(), c.data_ptr(), bytes->size());
  return at::from_blob(bytes->data(), c.sizes(), [bytes](void*) { delete bytes; }, c.options());
}

// Serves a step's logged decisions in call order per layer, mapped to the
// proxy's experts.
class MappedDecisions : public recorder::RoutingSource {
 public:
  MappedDecisions(const std::vector<LayerPlan>& plans, int64_t top_k) : top_k_(top_k) {
    for (const LayerPlan& p : plans) plans_.emplace(p.layer, p);
  }
  void BeginStep(const Trajectory::Decisions& step) {
    step_ = &step;
    next_.clear();
  }
  at::Tensor Route(int64_t layer, const at::Tensor& live, int64_t) override {
    at::DisableRecordFunctionGuard no_record;  // not the model's ops
    const auto& calls = step_->at(layer);
    const size_t i = next_[layer]++;
    MOERR_CHECK(i < calls.size()) << "layer " << layer << " routes more often than the original did";
    MOERR_CHECK(calls[i].first.size(0) == live.size(0)) << "layer " << layer << " routes another batch";
    return MapRouting(calls[i].first, calls[i].second, plans_.at(layer), top_k_);
  }

 private:
  std::map<int64_t, LayerPlan> plans_;
  int64_t top_k_;
  const Trajectory::Decisions* step_ = nullptr;
  std::map<int64_t, size_t> next_;
};

}  // namespace

void DecisionLog::OnRouting(const recorder::RoutingEvent& e) {
  at::DisableRecordFunctionGuard no_record;  // not the model's ops
  (*step)[e.layer].emplace_back(UncountedCopy(e.topk_ids), UncountedCopy(e.logits));
}

absl::Status RecordSteps(moe::GrpoTrainer& trainer, const std::string& path, int64_t steps) {
  MOERR_ASSIGN_OR_RETURN(auto rec, recorder::Recorder::Start(
                                       recorder::RecordOptions(path).set_overwrite(true).set_crash_handler(false)));
  trainer.policy()->SetRoutingObserver(rec.get());
  MOERR_RETURN_IF_ERROR(replayer::RecordTrainerStart(*rec, trainer));
  for (int64_t s = 0; s < steps; ++s) MOERR_RETURN_IF_ERROR(replayer::RecordStep(*rec, trainer, s).status());
  trainer.policy()->SetRoutingObserver(nullptr);
  return rec->Stop();
}

absl::Status RecordHealthyStep(const moe::MoeTransformer& warm, const std::string& path, uint64_t seed) {
  moe::MoeTransformer policy = moe::CopyOf(warm), reference = moe::CopyOf(warm);
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), moe::GrpoOptions(), seed);
  return RecordSteps(trainer, path, 1);
}

Trajectory Train(const moe::MoeTransformer& model, int64_t steps, uint64_t seed, const Trajectory* original,
                 const std::vector<LayerPlan>* plans) {
  MOERR_CHECK((original == nullptr) == (plans == nullptr)) << "a replayed original needs its expert map";
  Trajectory t;
  moe::PeakMemoryScope memory;
  moe::MoeTransformer policy = moe::CopyOf(model), reference = moe::CopyOf(model);
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), moe::GrpoOptions(), seed);
  const moe::GrpoOptions& options = trainer.options();
  const int64_t n = options.prompts * options.group_size;
  const int64_t micro = moe::SequencesPerForward(options);
  // Forwards per layer over the sampled batch: old log-probs, then training.
  const size_t batch_forwards = 2 * ((n + micro - 1) / micro);
  const std::vector<LayerPlan> no_plans;
  MappedDecisions policy_source(plans ? *plans : no_plans, model->config().top_k),
      reference_source(plans ? *plans : no_plans, model->config().top_k);
  DecisionLog policy_log, reference_log;
  if (original != nullptr) {
    MOERR_CHECK(static_cast<int64_t>(original->responses.size()) >= steps) << "a replayed trajectory as long";
    trainer.set_response_source([&](int64_t step, const at::Tensor&) {
      policy_source.BeginStep(original->policy_routing.at(step));
      reference_source.BeginStep(original->reference_routing.at(step));
      return original->responses.at(step);
    });
    policy->SetRoutingSource(&policy_source);
    reference->SetRoutingSource(&reference_source);
  }
  policy->SetRoutingObserver(&policy_log);  // sees the forced decisions when replaying
  reference->SetRoutingObserver(&reference_log);
  const auto start = Clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    policy_log.step = &t.policy_routing.emplace_back();
    reference_log.step = &t.reference_routing.emplace_back();
    const moe::StepMetrics m = trainer.Step();
    for (auto& [layer, calls] : t.policy_routing.back()) {  // the rollout's come first
      MOERR_CHECK(calls.size() >= batch_forwards) << "layer " << layer << " routed " << calls.size() << " times";
      calls.erase(calls.begin(), calls.end() - batch_forwards);
    }
    t.loss.push_back(m.loss), t.reward.push_back(m.reward), t.kl.push_back(m.kl), t.grad_norm.push_back(m.grad_norm);
    t.responses.push_back(trainer.last_batch().responses);
  }
  t.seconds = SecondsSince(start);
  t.peak_bytes = memory.peak_bytes();
  return t;
}

absl::StatusOr<std::vector<moe::StepMetrics>> FaultResponseRun(const moe::MoeTransformer& model, moe::FaultKind fault,
                                                               int64_t healthy, int64_t after, uint64_t seed) {
  std::vector<moe::StepMetrics> run;
  const moe::AdditionTask task;
  moe::MoeTransformer policy = moe::CopyOf(model), reference = moe::CopyOf(model);
  moe::GrpoTrainer trainer(policy, reference, task, moe::GrpoOptions(), seed);
  for (int64_t s = 0; s < healthy; ++s) run.push_back(trainer.Step());
  moe::MoeTransformer faulty = moe::CopyOf(trainer.policy()), faulty_reference = moe::CopyOf(trainer.reference());
  moe::GrpoOptions grpo;
  std::mt19937_64 calib_rng(17);
  const moe::AdditionTask::Batch calib = task.Sample(64, calib_rng);
  MOERR_RETURN_IF_ERROR(moe::InjectFault(fault, faulty, grpo, at::cat({calib.prompts, calib.answers}, 1)).status());
  moe::GrpoTrainer faulty_trainer(faulty, faulty_reference, task, grpo, seed + 1);
  for (int64_t s = 0; s < after; ++s) {
    run.push_back(faulty_trainer.Step());
    run.back().step = healthy + s;
  }
  return run;
}

int64_t MicroBatchedPeakMemory(const moe::MoeTransformer& model, int64_t micro_batch) {
  moe::PeakMemoryScope memory;
  moe::MoeTransformer policy = moe::CopyOf(model), reference = moe::CopyOf(model);
  moe::GrpoOptions options;
  options.micro_batch = micro_batch;
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), options, 5);
  for (int step = 0; step < 2; ++step) trainer.Step();
  return memory.peak_bytes();
}

}  // namespace moerr::proxy
