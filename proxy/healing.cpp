#include "proxy/healing.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_format.h"
#include "formats/annotations.h"
#include "formats/json_number.h"
#include "formats/module_path.h"
#include "moe/checkpoint.h"
#include "moe/addition_task.h"
#include "proxy/step_bundle.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::proxy {
namespace {

// Whole task sequences [n, S] int64 from `rng`.
at::Tensor Sequences(int64_t n, std::mt19937_64& rng) {
  const moe::AdditionTask::Batch b = moe::AdditionTask().Sample(n, rng);
  return at::cat({b.prompts, b.answers}, 1);
}

// KL(teacher || student) per token of next-token distributions, from the
// teacher's log-probs `lt` and the student's logits [n, S, V].
at::Tensor TokenKl(const at::Tensor& lt, const at::Tensor& student_logits) {
  const at::Tensor ls = at::log_softmax(student_logits, -1);
  return (lt.exp() * (lt - ls)).sum(-1).mean();
}

double HeldOutKl(moe::MoeTransformer& teacher, moe::MoeTransformer& student, const at::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const at::Tensor lt = at::log_softmax(teacher->forward(tokens).to(at::kDouble), -1);
  return TokenKl(lt, student->forward(tokens).to(at::kDouble)).item<double>();
}

}  // namespace

HealReport Distil(moe::MoeTransformer& teacher, moe::MoeTransformer& student, const Frozen& frozen,
                  const HealOptions& options) {
  at::DisableRecordFunctionGuard no_record;  // not a recorded step's ops
  HealReport report;
  report.frozen = frozen;
  report.steps = options.steps;
  std::mt19937_64 rng(options.seed), held_out_rng(options.seed + 99);
  const at::Tensor held_out = Sequences(64, held_out_rng);
  report.kl_before = HeldOutKl(teacher, student, held_out);
  const std::set<std::string> frozen_set(frozen.tensors.begin(), frozen.tensors.end());
  std::vector<at::Tensor> trained;
  std::vector<std::pair<at::Tensor, bool>> restore;  // frozen tensors and their requires_grad
  std::vector<std::pair<at::Tensor, unsigned>> hooks;  // tensors with frozen rows and their hook
  for (auto& item : student->named_parameters()) {
    at::Tensor& p = item.value();
    if (frozen_set.count(item.key())) {
      restore.emplace_back(p, p.requires_grad());
      p.set_requires_grad(false);  // no gradient, so AdamW never touches it
      continue;
    }
    trained.push_back(p);
    const auto rows = frozen.rows.find(item.key());
    if (rows == frozen.rows.end() || rows->second.empty()) continue;
    const at::Tensor index = at::tensor(rows->second, at::kLong);
    hooks.emplace_back(p, p.register_hook([index](const at::Tensor& g) { return g.index_fill(0, index, 0); }));
  }
  torch::optim::AdamW optimizer(trained, torch::optim::AdamWOptions(options.lr).weight_decay(0.0));
  for (int64_t step = 0; step < options.steps; ++step) {
    const at::Tensor tokens = Sequences(options.batch, rng);
    at::Tensor lt;
    {
      torch::NoGradGuard no_grad;
      lt = at::log_softmax(teacher->forward(tokens), -1);
    }
    const at::Tensor loss = TokenKl(lt, student->forward(tokens));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  }
  for (auto& [p, requires] : restore) p.set_requires_grad(requires);
  for (auto& [p, hook] : hooks) p.remove_hook(hook);
  report.kl_after = HeldOutKl(teacher, student, held_out);
  return report;
}

Frozen ForcedKeepParameters(const moe::MoeTransformer& proxy, const std::vector<LayerPlan>& plans) {
  std::map<int64_t, std::set<int64_t>> forced;  // layer -> proxy experts
  for (const LayerPlan& p : plans) {
    for (int64_t e : p.forced) {
      const auto it = std::find(p.kept.begin(), p.kept.end(), e);
      if (it != p.kept.end()) forced[p.layer].insert(it - p.kept.begin());
    }
  }
  Frozen out;
  const std::string mlp = proxy->config().MlpName();
  for (const auto& item : proxy->named_parameters()) {
    const auto expert = formats::ExpertOf(item.key());
    if (expert) {
      const auto layer = forced.find(expert->first);
      if (layer != forced.end() && layer->second.count(expert->second)) out.tensors.push_back(item.key());
      continue;
    }
    for (const auto& [layer, experts] : forced) {
      if (item.key() == absl::StrFormat("model.layers.%d.%s.gate.weight", layer, mlp)) {
        out.rows[item.key()] = std::vector<int64_t>(experts.begin(), experts.end());
      }
    }
  }
  return out;
}

absl::StatusOr<HealReport> HealProxy(const formats::BundleReader& original, const ProxyReport& built,
                                     const HealOptions& options, const std::string& source) {
  const std::string where = absl::StrFormat("healing the proxy %s of %s, step %d", built.bundle, source, built.step);
  HealReport report;
  const absl::Status status = CatchTorch("healing", [&]() -> absl::Status {
    MOERR_ASSIGN_OR_RETURN(const StepBundle teacher_step, LoadStepBundle(original, built.step, source));
    MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer teacher, LoadPolicy(teacher_step));
    StepBundle proxy_step;
    llvm::json::Object info;
    {
      MOERR_ASSIGN_OR_RETURN(auto reader, formats::BundleReader::Open(built.bundle));
      MOERR_ASSIGN_OR_RETURN(proxy_step, LoadStepBundle(*reader, built.step, built.bundle));
      MOERR_ASSIGN_OR_RETURN(info, formats::ReadObjectAnnotation(*reader, formats::kProxyAnnotation, -1, built.bundle));
    }
    MOERR_ASSIGN_OR_RETURN(moe::MoeTransformer student, LoadPolicy(proxy_step));
    report = Distil(teacher, student, ForcedKeepParameters(student, built.plans), options);
    // The policy's tensors, and the reference's that were the policy's bitwise.
    std::map<std::string, at::Tensor> healed;
    for (const auto& item : student->named_parameters()) healed[item.key()] = item.value().detach().clone();
    std::map<std::string, at::Tensor> policy_before;
    for (const auto& [name, t] : proxy_step.state.tensors) {
      if (name.rfind("policy/", 0) == 0) policy_before[name.substr(7)] = t;
    }
    for (auto& [name, t] : proxy_step.state.tensors) {
      for (const char* prefix : {"policy/", "reference/"}) {
        if (name.rfind(prefix, 0) != 0) continue;
        const std::string hf = name.substr(std::string(prefix).size());
        const auto it = healed.find(hf);
        if (it == healed.end()) continue;
        const bool is_policy = std::string(prefix) == "policy/";
        if (is_policy || (policy_before.count(hf) && at::equal(policy_before.at(hf), t))) t = it->second.to(t.scalar_type());
      }
    }
    info["healing"] = ToJson(report);
    MOERR_RETURN_IF_ERROR(
        WriteStepBundle(proxy_step, built.bundle, llvm::json::Object{{formats::kProxyAnnotation, std::move(info)}}));
    return Annotate(moe::SaveCheckpoint(student, built.checkpoint, /*overwrite=*/true), built.checkpoint);
  });
  MOERR_RETURN_IF_ERROR(Annotate(status, where));
  return report;
}

llvm::json::Object ToJson(const HealReport& r) {
  llvm::json::Array frozen;
  for (const std::string& n : r.frozen.tensors) frozen.push_back(n);
  llvm::json::Object rows;
  for (const auto& [name, indices] : r.frozen.rows) {
    llvm::json::Array a;
    for (int64_t i : indices) a.push_back(i);
    rows[name] = std::move(a);
  }
  return llvm::json::Object{{"steps", r.steps},
                            {"kl_before", formats::JsonNumber(r.kl_before)},
                            {"kl_after", formats::JsonNumber(r.kl_after)},
                            {"frozen", std::move(frozen)},
                            {"frozen_rows", std::move(rows)}};
}

}  // namespace moerr::proxy
