#include "moe/moe_layer.h"

#include <ATen/record_function.h>

#include "moe/numerics.h"

namespace moerr::moe {

MoeLayerImpl::MoeLayerImpl(const MoeConfig& config, int64_t layer, std::string path)
    : config_(config), path_(std::move(path)) {
  const bool mixtral = config.family == Family::kMixtral;
  gate_ = register_module("gate", Router(config, layer, path_ + ".gate"));
  experts_ = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < config.num_experts; ++e) {
    experts_->push_back(Expert(config.hidden_size, config.moe_intermediate_size, mixtral,
                               path_ + ".experts." + std::to_string(e)));
  }
  if (config.num_shared_experts > 0 && config.family == Family::kQwen2Moe) {
    shared_ = register_module("shared_expert", Expert(config.hidden_size, config.shared_expert_intermediate_size,
                                                      false, path_ + ".shared_expert"));
    shared_gate_ = register_module("shared_expert_gate",
                                   torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, 1).bias(false)));
  } else if (config.num_shared_experts > 0) {
    shared_ = register_module("shared_experts",
                              Expert(config.hidden_size, config.num_shared_experts * config.moe_intermediate_size,
                                     false, path_ + ".shared_experts"));
  }
}

at::Tensor MoeLayerImpl::forward(const at::Tensor& x) {
  RECORD_USER_SCOPE(path_);
  const int64_t hidden = x.size(-1), k = config_.top_k, experts = config_.num_experts;
  const at::Tensor flat = x.reshape({-1, hidden});
  const int64_t tokens = flat.size(0);
  const RouterOutput route = gate_(flat);

  const at::Tensor ids = route.topk_ids.reshape({-1});  // [T*k]
  const at::Tensor weights = route.topk_weights.reshape({-1, 1});
  const at::Tensor token_of_slot = at::arange(tokens, ids.options()).repeat_interleave(k);
  const at::Tensor order = std::get<1>(ids.sort(/*stable=*/c10::optional<bool>(true), /*dim=*/0));
  counts_ = at::bincount(ids, {}, experts);
  const auto counts = counts_.accessor<int64_t, 1>();

  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    const at::Tensor slots = order.narrow(0, offset, n);
    offset += n;
    const at::Tensor rows = flat.index_select(0, token_of_slot.index_select(0, slots));
    outputs.push_back(experts_[e]->as<Expert>()->forward(rows) * weights.index_select(0, slots));
  }
  at::Tensor out = at::zeros_like(flat).index_add(0, token_of_slot.index_select(0, order), at::cat(outputs, 0));

  if (shared_) {
    at::Tensor shared = shared_(flat);
    if (shared_gate_) shared = at::sigmoid(shared_gate_(flat)) * shared;
    out = out + shared;
  }
  const at::Tensor share = counts_.to(at::kFloat) / static_cast<double>(tokens * k);
  aux_loss_ = experts * (share * route.probs.mean(0)).sum();
  return Boundary(out.view(x.sizes()));
}

}  // namespace moerr::moe
