#include "moe/grpo_trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>

#include "moe/warmup.h"

namespace moerr::moe {

GrpoTrainer::GrpoTrainer(MoeTransformer policy, MoeTransformer reference, AdditionTask task, GrpoOptions options,
                         uint64_t seed)
    : policy_(std::move(policy)),
      reference_(std::move(reference)),
      task_(task),
      options_(options),
      seed_(seed),
      rng_(seed),
      loss_scale_(options.numerics.precision == Precision::kFp16Emu ? options.initial_loss_scale : 1.0) {
  for (auto& p : reference_->parameters()) p.set_requires_grad(false);
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      policy_->parameters(), torch::optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
}

StepMetrics GrpoTrainer::Step() {
  StepMetrics m;
  m.step = step_;
  const int64_t g = options_.group_size, n = options_.prompts * g;
  AdditionTask::Batch batch;
  {
    RECORD_USER_SCOPE("batch");
    batch = task_.Sample(options_.prompts, rng_);
  }
  const at::Tensor prompts = batch.prompts.repeat_interleave(g, 0);  // [n, P]
  const at::Tensor answers = batch.answers.repeat_interleave(g, 0);

  // Rollout, under the rollout precision.
  at::Tensor responses, old_logp;
  {
    NumericsScope scope(options_.rollout_numerics);
    torch::NoGradGuard no_grad;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003 + step_);
    responses = Generate(policy_, prompts, task_.answer_length(), options_.temperature, gen);
    const at::Tensor seq = at::cat({prompts, responses}, 1);
    old_logp = TokenLogProbs(policy_->forward(seq.narrow(1, 0, seq.size(1) - 1)), prompts, responses).to(at::kFloat);
  }
  const at::Tensor seq = at::cat({prompts, responses}, 1);
  const at::Tensor inputs = seq.narrow(1, 0, seq.size(1) - 1);
  // Tokens up to and including the first EOS count.
  const at::Tensor eos_seen = responses.eq(AdditionTask::kEos).to(at::kLong).cumsum(1);
  const at::Tensor mask = (eos_seen - responses.eq(AdditionTask::kEos).to(at::kLong)).eq(0).to(at::kFloat);
  const at::Tensor rewards = task_.Reward(answers, responses);  // [n]
  const at::Tensor grouped = rewards.view({options_.prompts, g});
  const at::Tensor advantages =
      ((grouped - grouped.mean(1, true)) / (grouped.std(1, /*unbiased=*/true, true) + 1e-6)).view({n, 1});
  at::Tensor ref_logp;
  {
    torch::NoGradGuard no_grad;
    ref_logp = TokenLogProbs(reference_->forward(inputs), prompts, responses);
  }

  // Training forward and loss, under the training precision.
  at::Tensor loss;
  {
    NumericsScope scope(options_.numerics);
    const at::Tensor logp =
        TokenLogProbs(policy_->forward(inputs), prompts, responses, options_.naive_fp16_softmax).to(at::kFloat);
    const at::Tensor ratio = at::exp(logp - old_logp);
    const at::Tensor clipped = ratio.clamp(1 - options_.clip_eps, 1 + options_.clip_eps);
    const at::Tensor surrogate = at::min(ratio * advantages, clipped * advantages);
    const at::Tensor log_ref_ratio = ref_logp - logp;
    const at::Tensor kl = at::exp(log_ref_ratio) - log_ref_ratio - 1;
    const at::Tensor tokens = mask.sum().clamp_min(1);
    loss = ((-surrogate + options_.kl_coef * kl) * mask).sum() / tokens + options_.aux_loss_coef * policy_->AuxLoss();
    torch::NoGradGuard no_grad;
    m.kl = ((kl * mask).sum() / tokens).item<double>();
    m.clip_fraction = ((ratio - clipped).abs().gt(1e-9).to(at::kFloat) * mask).sum().item<double>() / tokens.item<double>();
    m.ratio_error = (((ratio - 1).abs() * mask).sum() / tokens).item<double>();
  }
  m.loss = loss.item<double>();
  m.reward = rewards.mean().item<double>();
  {
    double entropy = 0;
    const auto layers = policy_->MoeLayers();
    for (const MoeLayer& layer : layers) {
      const at::Tensor share = layer->expert_counts().to(at::kDouble) / layer->expert_counts().sum().to(at::kDouble);
      entropy += -(share * share.clamp_min(1e-30).log()).sum().item<double>() / std::log(double(share.numel()));
      m.top_expert_share += share.max().item<double>() / layers.size();
    }
    m.load_entropy = layers.empty() ? 0 : entropy / layers.size();
  }

  // Backward, loss scaling, update.
  {
    RECORD_USER_SCOPE("optimizer");
    optimizer_->zero_grad();
  }
  {
    NumericsScope scope(options_.numerics);
    (loss * loss_scale_).backward();
  }
  RECORD_USER_SCOPE("optimizer");
  std::vector<at::Tensor> params = policy_->parameters();
  bool finite = std::isfinite(m.loss);
  double sq = 0;
  {
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : params) {
      if (!p.grad().defined()) continue;
      p.mutable_grad().div_(loss_scale_);
      sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    }
  }
  m.grad_norm = std::sqrt(sq);
  finite = finite && std::isfinite(m.grad_norm);
  m.finite = finite;
  m.loss_scale = loss_scale_;
  if (!finite) {
    m.skipped = true;
    if (options_.numerics.precision == Precision::kFp16Emu) loss_scale_ /= 2;
    good_steps_ = 0;
  } else {
    torch::nn::utils::clip_grad_norm_(params, options_.max_grad_norm);
    if (!options_.skip_update) optimizer_->step();
    if (options_.numerics.precision == Precision::kFp16Emu && ++good_steps_ % options_.scale_growth_interval == 0) {
      loss_scale_ *= 2;
    }
  }
  ++step_;
  return m;
}

}  // namespace moerr::moe
