#include "moe/warmup.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include "moe/numerics.h"
#include "moe/parallel.h"

namespace moerr::moe {

at::Tensor Generate(MoeTransformer& model, const at::Tensor& prompts, int64_t steps, double temperature,
                    c10::optional<at::Generator> generator) {
  // The sampling loop is the rollout engine's work: a recorder does not
  // trace it, and the responses are a leaf of the step (op_tracer.h).
  RECORD_USER_SCOPE("generate");
  RolloutScope rollout;
  torch::NoGradGuard no_grad;
  at::Tensor seq = prompts;
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor logits = model->forward(seq).select(1, seq.size(1) - 1);  // [n, V]
    at::Tensor next;
    if (temperature <= 0) {
      next = logits.argmax(-1, /*keepdim=*/true);
    } else {
      // A non-finite logit (an overflowing model) samples token 0, as a
      // runtime would that clamps; the fault still shows in the loss.
      const at::Tensor probs = at::softmax(logits / temperature, -1).nan_to_num(0.0, 0.0, 0.0) + 1e-12;
      next = at::multinomial(probs, 1, /*replacement=*/false, generator);
    }
    seq = at::cat({seq, next}, 1);
  }
  return seq.narrow(1, prompts.size(1), steps);
}

at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& prompts, const at::Tensor& responses,
                         bool naive_fp16_softmax) {
  RECORD_USER_SCOPE("lm_head.log_softmax");
  const int64_t p = prompts.size(1), a = responses.size(1);
  const at::Tensor predicting = logits.narrow(1, p - 1, a);  // logits at i predict token i + 1
  at::Tensor logp;
  if (naive_fp16_softmax) {
    const at::Tensor e = RoundToFp16(predicting.exp(), /*saturate=*/false);
    logp = (e / e.sum(-1, /*keepdim=*/true)).log();
  } else {
    logp = at::log_softmax(predicting, -1);
  }
  return logp.gather(2, responses.unsqueeze(-1)).squeeze(-1);
}

double Accuracy(MoeTransformer& model, const AdditionTask& task, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const AdditionTask::Batch batch = task.Sample(n, rng);
  const at::Tensor answers = Generate(model, batch.prompts, task.answer_length(), 0.0, c10::nullopt);
  return answers.eq(batch.answers).all(1).to(at::kFloat).mean().item<double>();
}

WarmupReport Warmup(MoeTransformer& model, const AdditionTask& task, const WarmupOptions& options,
                    const std::function<void(int64_t, double)>& on_step) {
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.lr).weight_decay(0.0));
  std::mt19937_64 rng(options.seed);
  WarmupReport report;
  for (int64_t step = 0; step < options.steps; ++step) {
    const AdditionTask::Batch batch = task.Sample(options.batch, rng);
    const at::Tensor seq = at::cat({batch.prompts, batch.answers}, 1);
    const at::Tensor logits = model->forward(seq.narrow(1, 0, seq.size(1) - 1));
    const at::Tensor logp = TokenLogProbs(logits, batch.prompts, batch.answers);
    const at::Tensor loss = -logp.mean() + model->config().router_aux_loss_coef * model->AuxLoss();
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    report.final_loss = loss.item<double>();
    if (on_step) on_step(step, report.final_loss);
  }
  report.accuracy = Accuracy(model, task, 256, options.seed + 1);
  return report;
}

}  // namespace moerr::moe
