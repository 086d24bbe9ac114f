#include "moe/grpo_trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_set>

#include "absl/strings/str_format.h"
#include "moe/checkpoint.h"
#include "moe/warmup.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::moe {
namespace {

// The first mapping error under `root`, e.g. "trainer state: expected integer at trainer_state.step".
absl::Status JsonError(const char* what, const llvm::json::Path::Root& root) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", what, llvm::toString(root.getError())));
}

}  // namespace

int64_t ResponseTokens(const GrpoOptions& options, const AdditionTask& task) {
  return options.response_tokens > 0 ? std::min(options.response_tokens, task.answer_length()) : task.answer_length();
}

GrpoTrainer::GrpoTrainer(MoeTransformer policy, MoeTransformer reference, AdditionTask task, GrpoOptions options,
                         uint64_t seed)
    : policy_(std::move(policy)),
      reference_(std::move(reference)),
      task_(task),
      options_(options),
      seed_(seed),
      rng_(seed),
      loss_scale_(IsFp16(options.numerics.precision) ? options.initial_loss_scale : 1.0) {
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
  std::map<std::string, int64_t> adam_steps;  // parameter name -> Adam step, for updated parameters only
  const llvm::json::Value value = llvm::json::Object(scalars);
  llvm::json::Path::Root root("trainer_state");
  llvm::json::ObjectMapper m(value, root);
  const bool ok = m && m.map("step", step) && m.map("seed", seed) && m.map("loss_scale", loss_scale) &&
                  m.map("good_steps", good_steps) && m.map("rng", rng_text) && m.map("adam_step", adam_steps);
  if (!ok) return JsonError("trainer state", root);
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
    const auto n = adam_steps.find(name);
    const bool has_step = n != adam_steps.end();
    if (a == exp_avg.end() && b == exp_avg_sq.end() && !has_step) continue;  // no update yet
    if (a == exp_avg.end() || b == exp_avg_sq.end() || !has_step || n->second < 1) {
      return absl::InvalidArgumentError("trainer state: incomplete Adam state for " + name);
    }
    if (a->second.shape != p.sizes().vec() || b->second.shape != p.sizes().vec()) {
      return absl::InvalidArgumentError("trainer state: Adam moments of " + name + " do not fit its shape");
    }
    moments[i].step = n->second;
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

int64_t GrpoTrainer::LocalSequences() const {
  const int64_t world_n = options_.prompts * options_.group_size;
  return parallel_ ? world_n / parallel_->layout().world_size : world_n;
}

StepMetrics GrpoTrainer::Step() {
  StepMetrics m;
  m.step = step_;
  at::Tensor inputs, rewards;
  last_batch_ = Rollout(inputs, rewards);
  Backward(inputs, rewards, m);
  Update(m);
  ++step_;
  return m;
}

StepBatch GrpoTrainer::Rollout(at::Tensor& inputs, at::Tensor& rewards) {
  const int64_t g = options_.group_size, world_n = options_.prompts * g;
  const int64_t n = LocalSequences();
  AdditionTask::Batch batch;
  {
    RECORD_USER_SCOPE("batch");
    batch = batch_source_ ? batch_source_(step_) : task_.Sample(options_.prompts, rng_);
    MOERR_CHECK(batch.prompts.size(0) == options_.prompts && batch.answers.size(0) == options_.prompts)
        << "a batch source gives " << options_.prompts << " prompts";
  }
  const int64_t answer_tokens = ResponseTokens(options_, task_);
  const int64_t micro = SequencesPerForward(options_);
  const at::Tensor global_prompts = batch.prompts.repeat_interleave(g, 0);  // [world_n, P]
  const at::Tensor prompts = Shard(global_prompts);                           // [n, P]
  // [n, A]; narrowed only when truncated, so a whole step records no extra op.
  const at::Tensor answers = Shard((answer_tokens < batch.answers.size(1) ? batch.answers.narrow(1, 0, answer_tokens)
                                                                          : batch.answers)
                                       .repeat_interleave(g, 0));

  // Rollout, under the rollout precision.
  at::Tensor responses, old_logp;
  {
    NumericsScope scope(options_.rollout_numerics);
    torch::NoGradGuard no_grad;
    const uint64_t rank = parallel_ ? static_cast<uint64_t>(parallel_->layout().rank) : 0;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003 + step_ + rank * 0x9E3779B97F4A7C15ull);
    if (response_source_) {
      // The rollout engine's work, as Generate's is: a recorder does not
      // trace it (op_tracer.h), so a step fed its responses records the ops
      // of a step that sampled them.
      RECORD_USER_SCOPE("generate");
      responses = response_source_(step_, global_prompts);
      MOERR_CHECK(responses.dim() == 2 && responses.size(0) == world_n && responses.size(1) == answer_tokens)
          << "a response source gives [" << world_n << ", " << answer_tokens << "] responses";
      responses = Shard(responses);
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
  rewards = task_.Reward(answers, responses);  // [n]
  const at::Tensor grouped = rewards.view({n / g, g});
  const at::Tensor advantages =
      ((grouped - grouped.mean(1, true)) / (grouped.std(1, /*unbiased=*/true, true) + 1e-6)).view({n, 1});
  at::Tensor ref_logp;
  {
    // Under the training precision, so the KL to the reference measures the
    // policy's drift, not a precision difference (0 while they are equal).
    NumericsScope scope(options_.numerics);
    ref_logp = NoGradLogProbs(reference_, inputs, prompts, responses, micro);
  }

  return StepBatch{prompts, responses, mask, advantages, old_logp, ref_logp};
}

void GrpoTrainer::Backward(const at::Tensor& inputs, const at::Tensor& rewards, StepMetrics& m) {
  const int64_t world_n = options_.prompts * options_.group_size;
  const int64_t n = LocalSequences();
  const int64_t micro = SequencesPerForward(options_);
  const StepBatch& b = last_batch_;
  const at::Tensor &prompts = b.prompts, &responses = b.responses, &mask = b.mask, &advantages = b.advantages,
                   &old_logp = b.old_logp, &ref_logp = b.ref_logp;
  // Gradients are dropped, not zeroed (PyTorch 2's set_to_none), before the
  // training forward: backward writes fresh ones, the step reads nothing of
  // the last one's, and they need not be alive beside the activations.
  for (at::Tensor& p : policy_->parameters()) p.mutable_grad().reset();

  // Training forward, loss and backward under the training precision, one
  // micro-batch at a time. A micro-batch's loss is its share of the step's:
  // its token terms over all the step's response tokens, its router aux loss
  // weighted by its share of the sequences; the metrics add up the same way.
  at::Tensor tokens = mask.sum();
  if (parallel_) parallel_->AllReduceSum(tokens, CommGroup::kWorld);  // the world's response tokens
  tokens = tokens.clamp_min(1);
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
  if (parallel_) {
    // The world's totals: each rank's loss and metrics are its share of them.
    at::Tensor sums = at::tensor({m.loss, m.kl, m.clip_fraction, m.ratio_error, rewards.sum().item<double>()},
                                 at::TensorOptions(at::kDouble));
    parallel_->AllReduceSum(sums, CommGroup::kWorld);
    const auto v = sums.accessor<double, 1>();
    m.loss = v[0], m.kl = v[1], m.clip_fraction = v[2], m.ratio_error = v[3], m.reward = v[4] / world_n;
  }
}

void GrpoTrainer::Update(StepMetrics& m) {
  RECORD_USER_SCOPE("optimizer");
  if (parallel_) SyncGradients();
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : policy_->parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  bool finite = std::isfinite(m.loss);
  if (!grads.empty() || parallel_) {
    torch::NoGradGuard no_grad;
    if (!grads.empty()) at::_foreach_div_(grads, loss_scale_);
    m.grad_norm = GradNorm(grads);
  }
  finite = finite && std::isfinite(m.grad_norm);
  if (parallel_) {  // the loss scaler's found-inf flag: one decision for the world
    at::Tensor found_inf = at::tensor({finite ? 0.0 : 1.0}, at::TensorOptions(at::kDouble));
    parallel_->AllReduceSum(found_inf, CommGroup::kWorld);
    finite = found_inf.item<double>() == 0;
  }
  m.finite = finite;
  m.loss_scale = loss_scale_;
  if (!finite) {
    m.skipped = true;
    if (IsFp16(options_.numerics.precision)) loss_scale_ /= 2;
    good_steps_ = 0;
  } else {
    // Clipped as torch::nn::utils::clip_grad_norm_ clips: by max / (norm + 1e-6) when that is below 1.
    const double clip = options_.max_grad_norm / (m.grad_norm + 1e-6);
    if (clip < 1) {
      torch::NoGradGuard no_grad;
      at::_foreach_mul_(grads, clip);
    }
    if (!options_.skip_update) optimizer_->Step();
    if (IsFp16(options_.numerics.precision) && ++good_steps_ % options_.scale_growth_interval == 0) {
      loss_scale_ *= 2;
    }
  }
}

namespace {

// The routed experts' parameters (every expert's, hosted here or not).
std::unordered_set<const c10::TensorImpl*> RoutedExpertParameters(const MoeTransformer& model) {
  std::unordered_set<const c10::TensorImpl*> out;
  for (MoeLayer layer : model->MoeLayers()) {
    for (int64_t e = 0; e < model->config().num_experts; ++e) {
      for (const at::Tensor& p : layer->expert(e)->parameters()) out.insert(p.unsafeGetTensorImpl());
    }
  }
  return out;
}

double SumOfSquares(const std::vector<at::Tensor>& grads) {
  return grads.empty() ? 0.0 : at::stack(at::_foreach_norm(grads)).to(at::kDouble).pow(2).sum().item<double>();
}

// Sums the gradients of `params` over `group`. A gradient no rank of the
// group has stays undefined (the optimizer skips it, as it skips an expert
// that got no tokens in one process); one that some rank lacks counts as 0.
void SumGradients(Parallel& parallel, const std::vector<at::Tensor>& params, CommGroup group) {
  torch::NoGradGuard no_grad;
  std::vector<double> defined;
  for (const at::Tensor& p : params) defined.push_back(p.grad().defined() ? 1 : 0);
  at::Tensor has = at::tensor(defined, at::TensorOptions(at::kDouble));
  parallel.AllReduceSum(has, group);
  std::vector<at::Tensor> grads, flat;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    if (has[i].item<double>() == 0) continue;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    MOERR_CHECK(p.grad().scalar_type() == params[0].scalar_type()) << "gradients of one dtype";
    grads.push_back(p.grad());
    flat.push_back(p.grad().reshape({-1}));
  }
  if (grads.empty()) return;
  at::Tensor sum = at::cat(flat);
  parallel.AllReduceSum(sum, group);
  int64_t offset = 0;
  for (at::Tensor& g : grads) {
    g.copy_(sum.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

}  // namespace

absl::Status GrpoTrainer::CheckParallel(const GrpoOptions& options, const MoeConfig& config, const ParallelLayout& l) {
  if (options.prompts % l.world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d prompts per step do not split over %d ranks", options.prompts, l.world_size));
  }
  if (options.micro_batch != 0) return absl::InvalidArgumentError("micro-batches with more than one rank: not yet");
  if (l.world_size % l.ep_size != 0 || config.num_experts % l.ep_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("expert parallelism %d must divide the ranks (%d) and the experts (%d)",
                                                      l.ep_size, l.world_size, config.num_experts));
  }
  return absl::OkStatus();
}

absl::Status GrpoTrainer::set_parallel(Parallel* parallel) {
  if (parallel != nullptr) MOERR_RETURN_IF_ERROR(CheckParallel(options_, policy_->config(), parallel->layout()));
  parallel_ = parallel;
  policy_->SetParallel(parallel);
  reference_->SetParallel(parallel);
  return absl::OkStatus();
}

at::Tensor GrpoTrainer::Shard(const at::Tensor& t) const {
  if (parallel_ == nullptr) return t;
  const int64_t rows = t.size(0) / parallel_->layout().world_size;
  return t.narrow(0, parallel_->layout().rank * rows, rows);
}

// Dense parameters over the world; each expert hosted here over its replicas.
void GrpoTrainer::SyncGradients() {
  const ParallelLayout& l = parallel_->layout();
  const auto experts = RoutedExpertParameters(policy_);
  std::vector<at::Tensor> dense, local;
  for (const at::Tensor& p : policy_->parameters()) {
    if (experts.count(p.unsafeGetTensorImpl()) == 0) dense.push_back(p);
  }
  const int64_t x = policy_->config().num_experts;
  for (MoeLayer layer : policy_->MoeLayers()) {
    for (int64_t e = l.first_local_expert(x); e < l.first_local_expert(x) + l.local_experts(x); ++e) {
      for (const at::Tensor& p : layer->expert(e)->parameters()) local.push_back(p);
    }
  }
  SumGradients(*parallel_, dense, CommGroup::kWorld);
  SumGradients(*parallel_, local, CommGroup::kExpertReplicas);
}

// The L2 norm from the per-tensor norms, combined in double. Across ranks:
// the dense part is the same everywhere after SyncGradients; the experts'
// part is summed over the world and divided by the replica count (each
// expert's gradient is counted once per replica).
double GrpoTrainer::GradNorm(const std::vector<at::Tensor>& grads) {
  if (parallel_ == nullptr) return std::sqrt(SumOfSquares(grads));
  const auto experts = RoutedExpertParameters(policy_);
  std::vector<at::Tensor> dense, expert;
  for (const at::Tensor& p : policy_->parameters()) {
    if (p.grad().defined()) (experts.count(p.unsafeGetTensorImpl()) ? expert : dense).push_back(p.grad());
  }
  at::Tensor expert_sq = at::tensor({SumOfSquares(expert)}, at::TensorOptions(at::kDouble));
  parallel_->AllReduceSum(expert_sq, CommGroup::kWorld);
  return std::sqrt(SumOfSquares(dense) + expert_sq.item<double>() / parallel_->layout().replicas());
}

}  // namespace moerr::moe
