#include "moe/grpo_trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "moe/checkpoint.h"
#include "moe/warmup.h"
#include "recorder/tensor_adapter.h"
#include "support/check.h"
#include "support/json_fields.h"
#include "support/status.h"

namespace moerr::moe {

llvm::json::Object ToJson(const GrpoOptions& o) {
  return llvm::json::Object{{"prompts", o.prompts},
                            {"group_size", o.group_size},
                            {"response_tokens", o.response_tokens},
                            {"micro_batch", o.micro_batch},
                            {"temperature", o.temperature},
                            {"clip_eps", o.clip_eps},
                            {"kl_coef", o.kl_coef},
                            {"lr", o.lr},
                            {"weight_decay", o.weight_decay},
                            {"max_grad_norm", o.max_grad_norm},
                            {"aux_loss_coef", o.aux_loss_coef},
                            {"precision", PrecisionName(o.numerics.precision)},
                            {"fp16_saturate", o.numerics.saturate},
                            {"rollout_precision", PrecisionName(o.rollout_numerics.precision)},
                            {"rollout_fp16_saturate", o.rollout_numerics.saturate},
                            {"initial_loss_scale", o.initial_loss_scale},
                            {"scale_growth_interval", o.scale_growth_interval},
                            {"naive_fp16_softmax", o.naive_fp16_softmax},
                            {"skip_update", o.skip_update}};
}

int64_t ResponseTokens(const GrpoOptions& options, const AdditionTask& task) {
  return options.response_tokens > 0 ? std::min(options.response_tokens, task.answer_length()) : task.answer_length();
}

int64_t SequencesPerForward(const GrpoOptions& options) {
  const int64_t n = options.prompts * options.group_size;
  return options.micro_batch > 0 ? std::min(options.micro_batch, n) : n;
}

absl::StatusOr<GrpoOptions> GrpoOptionsFromJson(const llvm::json::Object& json) {
  GrpoOptions o;
  std::string precision, rollout_precision;
  JsonFields f(json, "GRPO options");
  f.Get("prompts", o.prompts);
  f.Get("group_size", o.group_size);
  f.Get("response_tokens", o.response_tokens);
  if (json.get("micro_batch") != nullptr) f.Get("micro_batch", o.micro_batch);  // absent before it existed
  f.Get("temperature", o.temperature);
  f.Get("clip_eps", o.clip_eps);
  f.Get("kl_coef", o.kl_coef);
  f.Get("lr", o.lr);
  f.Get("weight_decay", o.weight_decay);
  f.Get("max_grad_norm", o.max_grad_norm);
  f.Get("aux_loss_coef", o.aux_loss_coef);
  f.Get("precision", precision);
  f.Get("fp16_saturate", o.numerics.saturate);
  f.Get("rollout_precision", rollout_precision);
  f.Get("rollout_fp16_saturate", o.rollout_numerics.saturate);
  f.Get("initial_loss_scale", o.initial_loss_scale);
  f.Get("scale_growth_interval", o.scale_growth_interval);
  f.Get("naive_fp16_softmax", o.naive_fp16_softmax);
  f.Get("skip_update", o.skip_update);
  MOERR_RETURN_IF_ERROR(f.status());
  MOERR_ASSIGN_OR_RETURN(o.numerics.precision, ParsePrecision(precision));
  MOERR_ASSIGN_OR_RETURN(o.rollout_numerics.precision, ParsePrecision(rollout_precision));
  if (o.prompts < 1 || o.group_size < 2 || o.response_tokens < 0 || o.micro_batch < 0 || o.scale_growth_interval < 1 ||
      !(o.temperature > 0) || !(o.lr >= 0) || !(o.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        "GRPO options: prompts >= 1, group_size >= 2, response_tokens >= 0, micro_batch >= 0, scale_growth_interval >= 1, "
        "temperature > 0, lr >= 0 and weight_decay >= 0 are required");
  }
  return o;
}

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
  optimizer_ = std::make_unique<ForeachAdamW>(policy_->parameters(), options.lr, options.weight_decay);
}

namespace {

// Rows [begin, begin + len) of a [n, ...] tensor: the tensor itself when that
// is all of it, so a step without micro-batches records no extra op.
at::Tensor Rows(const at::Tensor& t, int64_t begin, int64_t len) {
  return len == t.size(0) ? t : t.narrow(0, begin, len);
}

// Log-probs [n, A] fp32 of `responses` under `model`, without gradients, one
// micro-batch of `micro` sequences at a time.
at::Tensor NoGradLogProbs(MoeTransformer& model, const at::Tensor& inputs, const at::Tensor& prompts,
                          const at::Tensor& responses, int64_t micro) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (int64_t begin = 0, n = inputs.size(0); begin < n; begin += micro) {
    const int64_t len = std::min(micro, n - begin);
    parts.push_back(TokenLogProbs(model->forward(Rows(inputs, begin, len)), Rows(prompts, begin, len),
                                  Rows(responses, begin, len))
                        .to(at::kFloat));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

// `tensors` entries named "PREFIX/NAME", by NAME.
std::map<std::string, formats::TensorView> WithPrefix(const std::map<std::string, formats::TensorView>& tensors,
                                                      const std::string& prefix) {
  std::map<std::string, formats::TensorView> out;
  for (auto it = tensors.lower_bound(prefix); it != tensors.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    out.emplace(it->first.substr(prefix.size()), it->second);
  }
  return out;
}

}  // namespace

TrainerState GrpoTrainer::SaveState() const {
  TrainerState state;
  std::ostringstream rng;
  rng << rng_;
  llvm::json::Object adam_steps;
  for (const auto& [name, t] : policy_->NamedTensors()) state.tensors.emplace_back("policy/" + name, t);
  for (const auto& [name, t] : reference_->NamedTensors()) state.tensors.emplace_back("reference/" + name, t);
  const auto named = policy_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    MOERR_CHECK(named[i].value().is_same(optimizer_->params().at(i))) << "the optimizer's parameters in model order";
    const ForeachAdamW::State& adam = optimizer_->state()[i];
    if (adam.step == 0) continue;  // not updated yet
    state.tensors.emplace_back("exp_avg/" + named[i].key(), adam.exp_avg);
    state.tensors.emplace_back("exp_avg_sq/" + named[i].key(), adam.exp_avg_sq);
    adam_steps[named[i].key()] = adam.step;
  }
  state.scalars = llvm::json::Object{{"step", step_},
                                     {"seed", static_cast<int64_t>(seed_)},
                                     {"loss_scale", loss_scale_},
                                     {"good_steps", good_steps_},
                                     {"rng", rng.str()},
                                     {"adam_step", std::move(adam_steps)}};
  return state;
}

absl::Status GrpoTrainer::RestoreState(const llvm::json::Object& scalars,
                                       const std::map<std::string, formats::TensorView>& tensors) {
  int64_t step = 0, seed = 0, good_steps = 0;
  double loss_scale = 1;
  std::string rng_text;
  JsonFields f(scalars, "trainer state");
  f.Get("step", step);
  f.Get("seed", seed);
  f.Get("loss_scale", loss_scale);
  f.Get("good_steps", good_steps);
  f.Get("rng", rng_text);
  const llvm::json::Object* adam_steps = f.GetObject("adam_step");
  MOERR_RETURN_IF_ERROR(f.status());
  std::mt19937_64 rng;
  std::istringstream in(rng_text);
  if (!(in >> rng)) return absl::InvalidArgumentError("trainer state: \"rng\" is not a std::mt19937_64 state");
  MOERR_RETURN_IF_ERROR(Annotate(LoadWeights(policy_, WithPrefix(tensors, "policy/")), "policy"));
  MOERR_RETURN_IF_ERROR(Annotate(LoadWeights(reference_, WithPrefix(tensors, "reference/")), "reference"));
  const auto exp_avg = WithPrefix(tensors, "exp_avg/"), exp_avg_sq = WithPrefix(tensors, "exp_avg_sq/");
  const auto named = policy_->named_parameters();
  std::vector<ForeachAdamW::State> moments(named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].key();
    const at::Tensor& p = named[i].value();
    auto a = exp_avg.find(name), b = exp_avg_sq.find(name);
    auto n = adam_steps->getInteger(name);
    if (a == exp_avg.end() && b == exp_avg_sq.end() && !n) continue;  // no update yet
    if (a == exp_avg.end() || b == exp_avg_sq.end() || !n || *n < 1) {
      return absl::InvalidArgumentError("trainer state: incomplete Adam state for " + name);
    }
    if (a->second.shape != p.sizes().vec() || b->second.shape != p.sizes().vec()) {
      return absl::InvalidArgumentError("trainer state: Adam moments of " + name + " do not fit its shape");
    }
    moments[i].step = *n;
    moments[i].exp_avg = recorder::ToTensor(a->second).to(p.scalar_type());
    moments[i].exp_avg_sq = recorder::ToTensor(b->second).to(p.scalar_type());
  }
  optimizer_->state() = std::move(moments);
  step_ = step;
  seed_ = static_cast<uint64_t>(seed);
  loss_scale_ = loss_scale;
  good_steps_ = good_steps;
  rng_ = rng;
  return absl::OkStatus();
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
  const int64_t answer_tokens = ResponseTokens(options_, task_);
  const int64_t micro = SequencesPerForward(options_);
  const at::Tensor prompts = batch.prompts.repeat_interleave(g, 0);  // [n, P]
  // [n, A]; narrowed only when truncated, so a whole step records no extra op.
  const at::Tensor answers = (answer_tokens < batch.answers.size(1) ? batch.answers.narrow(1, 0, answer_tokens)
                                                                    : batch.answers)
                                 .repeat_interleave(g, 0);

  // Rollout, under the rollout precision.
  at::Tensor responses, old_logp, inputs;
  {
    NumericsScope scope(options_.rollout_numerics);
    torch::NoGradGuard no_grad;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003 + step_);
    if (response_source_) {
      responses = response_source_(step_, prompts);
      MOERR_CHECK(responses.dim() == 2 && responses.size(0) == n && responses.size(1) == answer_tokens)
          << "a response source gives [" << n << ", " << answer_tokens << "] responses";
    } else {
      responses = Generate(policy_, prompts, answer_tokens, options_.temperature, gen);
    }
    at::Tensor seq;
    {
      RECORD_USER_SCOPE("batch");  // the sampled responses join the step's batch here
      seq = at::cat({prompts, responses}, 1);
    }
    inputs = seq.narrow(1, 0, seq.size(1) - 1);  // [n, P + A - 1]: each position predicts the next token
    old_logp = NoGradLogProbs(policy_, inputs, prompts, responses, micro);
  }
  // Tokens up to and including the first EOS count.
  const at::Tensor eos_seen = responses.eq(AdditionTask::kEos).to(at::kLong).cumsum(1);
  const at::Tensor mask = (eos_seen - responses.eq(AdditionTask::kEos).to(at::kLong)).eq(0).to(at::kFloat);
  const at::Tensor rewards = task_.Reward(answers, responses);  // [n]
  const at::Tensor grouped = rewards.view({options_.prompts, g});
  const at::Tensor advantages =
      ((grouped - grouped.mean(1, true)) / (grouped.std(1, /*unbiased=*/true, true) + 1e-6)).view({n, 1});
  at::Tensor ref_logp;
  {
    // Under the training precision, so the KL to the reference measures the
    // policy's drift, not a precision difference (0 while they are equal).
    NumericsScope scope(options_.numerics);
    ref_logp = NoGradLogProbs(reference_, inputs, prompts, responses, micro);
  }

  last_batch_ = StepBatch{prompts, responses, mask, advantages, old_logp, ref_logp};

  // Gradients are dropped, not zeroed (PyTorch 2's set_to_none), before the
  // training forward: backward writes fresh ones, the step reads nothing of
  // the last one's, and they need not be alive beside the activations.
  for (at::Tensor& p : policy_->parameters()) p.mutable_grad().reset();

  // Training forward, loss and backward under the training precision, one
  // micro-batch at a time. A micro-batch's loss is its share of the step's:
  // its token terms over all the step's response tokens, its router aux loss
  // weighted by its share of the sequences; the metrics add up the same way.
  const at::Tensor tokens = mask.sum().clamp_min(1);
  const auto layers = policy_->MoeLayers();
  std::vector<at::Tensor> counts(layers.size());  // [E] int64 routed slots, over the micro-batches
  for (int64_t begin = 0; begin < n; begin += micro) {
    const int64_t len = std::min(micro, n - begin);
    const auto part = [&](const at::Tensor& t) { return Rows(t, begin, len); };
    at::Tensor loss;
    {
      NumericsScope scope(options_.numerics);
      const at::Tensor part_mask = part(mask), part_advantages = part(advantages);
      const at::Tensor logp =
          TokenLogProbs(policy_->forward(part(inputs)), part(prompts), part(responses), options_.naive_fp16_softmax)
              .to(at::kFloat);
      const at::Tensor ratio = at::exp(logp - part(old_logp));
      const at::Tensor clipped = ratio.clamp(1 - options_.clip_eps, 1 + options_.clip_eps);
      const at::Tensor surrogate = at::min(ratio * part_advantages, clipped * part_advantages);
      const at::Tensor log_ref_ratio = part(ref_logp) - logp;
      const at::Tensor kl = at::exp(log_ref_ratio) - log_ref_ratio - 1;
      const double aux_coef = len == n ? options_.aux_loss_coef : options_.aux_loss_coef * len / n;
      loss = ((-surrogate + options_.kl_coef * kl) * part_mask).sum() / tokens + aux_coef * policy_->AuxLoss();
      torch::NoGradGuard no_grad;
      m.kl += ((kl * part_mask).sum() / tokens).item<double>();
      m.clip_fraction +=
          ((ratio - clipped).abs().gt(1e-9).to(at::kFloat) * part_mask).sum().item<double>() / tokens.item<double>();
      m.ratio_error += (((ratio - 1).abs() * part_mask).sum() / tokens).item<double>();
    }
    m.loss += loss.item<double>();
    for (size_t l = 0; l < layers.size(); ++l) {
      counts[l] = counts[l].defined() ? counts[l] + layers[l]->expert_counts() : layers[l]->expert_counts();
    }
    if (begin + len == n) {
      m.reward = rewards.mean().item<double>();
      double entropy = 0;
      for (const at::Tensor& c : counts) {
        const at::Tensor share = c.to(at::kDouble) / c.sum().to(at::kDouble);
        entropy += -(share * share.clamp_min(1e-30).log()).sum().item<double>() / std::log(double(share.numel()));
        m.top_expert_share += share.max().item<double>() / layers.size();
      }
      m.load_entropy = layers.empty() ? 0 : entropy / layers.size();
    }
    NumericsScope scope(options_.numerics);
    (loss * loss_scale_).backward();
  }
  RECORD_USER_SCOPE("optimizer");
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : policy_->parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  bool finite = std::isfinite(m.loss);
  if (!grads.empty()) {
    torch::NoGradGuard no_grad;
    at::_foreach_div_(grads, loss_scale_);
    // The global L2 norm from the per-tensor norms, combined in double.
    m.grad_norm = std::sqrt(at::stack(at::_foreach_norm(grads)).to(at::kDouble).pow(2).sum().item<double>());
  }
  finite = finite && std::isfinite(m.grad_norm);
  m.finite = finite;
  m.loss_scale = loss_scale_;
  if (!finite) {
    m.skipped = true;
    if (options_.numerics.precision == Precision::kFp16Emu) loss_scale_ /= 2;
    good_steps_ = 0;
  } else {
    // Clipped as torch::nn::utils::clip_grad_norm_ clips: by max / (norm + 1e-6) when that is below 1.
    const double clip = options_.max_grad_norm / (m.grad_norm + 1e-6);
    if (clip < 1) {
      torch::NoGradGuard no_grad;
      at::_foreach_mul_(grads, clip);
    }
    if (!options_.skip_update) optimizer_->Step();
    if (options_.numerics.precision == Precision::kFp16Emu && ++good_steps_ % options_.scale_growth_interval == 0) {
      loss_scale_ *= 2;
    }
  }
  ++step_;
  return m;
}

}  // namespace moerr::moe
