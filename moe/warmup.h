// Supervised warm-up on the addition task, sampling and accuracy: gives the
// RL step a model with measurable ability.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <functional>

#include "moe/addition_task.h"
#include "moe/moe_transformer.h"

namespace moerr::moe {

// Appends `steps` tokens to `prompts` [n, P] and returns them [n, steps]:
// greedy when `temperature` is 0, else sampled from softmax(logits / T) with
// `generator` (deterministic under a seed).
at::Tensor Generate(MoeTransformer& model, const at::Tensor& prompts, int64_t steps, double temperature,
                    c10::optional<at::Generator> generator);

// Log-probabilities [n, A] of `responses` [n, A] after `prompts` [n, P],
// from logits of the full sequence. `naive_fp16_softmax` is the bad-kernel
// fault: softmax as exp(x) / sum(exp(x)) without subtracting the max, with
// exp rounded to fp16, so a logit above ~11.09 gives Inf / Inf = NaN.
at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& prompts, const at::Tensor& responses,
                         bool naive_fp16_softmax = false);

// Exact-match accuracy of greedy answers on `n` held-out prompts.
double Accuracy(MoeTransformer& model, const AdditionTask& task, int64_t n, uint64_t seed);

struct WarmupOptions {
  int64_t steps = 400;
  int64_t batch = 64;
  double lr = 3e-3;
  uint64_t seed = 0;
};

struct WarmupReport {
  double final_loss = 0;
  double accuracy = 0;  // exact match on 256 held-out prompts
};

// Teacher-forced cross-entropy on the answer tokens, AdamW. `on_step(step,
// loss)` reports progress.
WarmupReport Warmup(MoeTransformer& model, const AdditionTask& task, const WarmupOptions& options,
                    const std::function<void(int64_t, double)>& on_step = nullptr);

}  // namespace moerr::moe
