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
                               path_ + ".experts." + std::to_string(e), config.hidden_act));
  }
  if (config.num_shared_experts > 0 && config.family == Family::kQwen2Moe) {
    shared_ = register_module("shared_expert", Expert(config.hidden_size, config.shared_expert_intermediate_size,
                                                      false, path_ + ".shared_expert", config.hidden_act));
    shared_gate_ = register_module("shared_expert_gate",
                                   torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, 1).bias(false)));
  } else if (config.num_shared_experts > 0) {
    shared_ = register_module("shared_experts",
                              Expert(config.hidden_size, config.num_shared_experts * config.moe_intermediate_size,
                                     false, path_ + ".shared_experts", config.hidden_act));
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
  at::Tensor out;
  if (parallel_ == nullptr) {
    out = LocalForward(flat, weights, token_of_slot, order);
  } else {
    out = ExpertParallelForward(flat, weights, token_of_slot, order);
  }

  if (shared_) {
    at::Tensor shared = shared_(flat);
    if (shared_gate_) shared = at::sigmoid(shared_gate_(flat)) * shared;
    out = out + shared;
  }
  if (parallel_ == nullptr) {
    const at::Tensor share = counts_.to(at::kFloat) / static_cast<double>(tokens * k);
    aux_loss_ = experts * (share * route.probs.mean(0)).sum();
  } else {
    // This rank's part of the world's loss: f_e from the world's counts
    // (counts_ is global by now), P_e's sum over this rank's tokens divided
    // by the world's token count, so the parts add up to the one-process loss.
    const double world_tokens = static_cast<double>(counts_.sum().item<int64_t>() / k);
    const at::Tensor share = counts_.to(at::kFloat) / (world_tokens * k);
    aux_loss_ = experts * (share * route.probs.sum(0)).sum() / world_tokens;
  }
  return Boundary(out.view(x.sizes()));
}

at::Tensor MoeLayerImpl::LocalForward(const at::Tensor& flat, const at::Tensor& weights, const at::Tensor& token_of_slot,
                                      const at::Tensor& order) {
  const auto counts = counts_.accessor<int64_t, 1>();
  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  for (int64_t e = 0; e < config_.num_experts; ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    const at::Tensor slots = order.narrow(0, offset, n);
    offset += n;
    const at::Tensor rows = flat.index_select(0, token_of_slot.index_select(0, slots));
    outputs.push_back(experts_[e]->as<Expert>()->forward(rows) * weights.index_select(0, slots));
  }
  return at::zeros_like(flat).index_add(0, token_of_slot.index_select(0, order), at::cat(outputs, 0));
}

// Megatron-Core's all_to_all dispatch: the slots sorted by expert are cut
// into one run per EP rank (its experts are contiguous); the slot counts per
// (rank, local expert) are exchanged first, then the rows, which arrive
// sender-major. The local experts run on their rows expert-major (sender 0's
// rows first, so an expert sees the rows in the one-process order when the
// batch is split by rank in order), and the outputs go back the reverse way.
at::Tensor MoeLayerImpl::ExpertParallelForward(const at::Tensor& flat, const at::Tensor& weights,
                                               const at::Tensor& token_of_slot, const at::Tensor& order) {
  const ParallelLayout& layout = parallel_->layout();
  const int64_t experts = config_.num_experts, ep = layout.ep_size;
  const int64_t local = layout.local_experts(experts), first = layout.first_local_expert(experts);
  const at::Tensor send_counts = counts_;  // [experts]: slots for (EP rank r, its expert j) at r*local + j
  const at::Tensor recv_counts = parallel_->AllToAll(send_counts, std::vector<int64_t>(ep, local),
                                                     std::vector<int64_t>(ep, local));  // [sender, local expert]
  at::Tensor world_counts = counts_.clone();
  parallel_->AllReduceSum(world_counts, CommGroup::kWorld);
  counts_ = world_counts;

  const auto sc = send_counts.accessor<int64_t, 1>();
  const auto rc = recv_counts.accessor<int64_t, 1>();
  std::vector<int64_t> send_rows(ep, 0), recv_rows(ep, 0), start(ep * local);
  int64_t received_total = 0;
  for (int64_t r = 0; r < ep; ++r) {
    for (int64_t j = 0; j < local; ++j) {
      send_rows[r] += sc[r * local + j];
      start[r * local + j] = received_total;
      recv_rows[r] += rc[r * local + j];
      received_total += rc[r * local + j];
    }
  }
  const at::Tensor slot_tokens = token_of_slot.index_select(0, order);
  const at::Tensor received = parallel_->AllToAll(flat.index_select(0, slot_tokens), send_rows, recv_rows);

  // Expert-major order of the received rows, and per local expert its row count.
  std::vector<int64_t> perm;
  perm.reserve(received_total);
  std::vector<int64_t> per_expert(local, 0);
  for (int64_t j = 0; j < local; ++j) {
    for (int64_t r = 0; r < ep; ++r) {
      for (int64_t i = 0; i < rc[r * local + j]; ++i) perm.push_back(start[r * local + j] + i);
      per_expert[j] += rc[r * local + j];
    }
  }
  const at::Tensor perm_t = at::tensor(perm, order.options());
  const at::Tensor rows = received.index_select(0, perm_t);
  std::vector<at::Tensor> outputs;
  for (int64_t j = 0, offset = 0; j < local; offset += per_expert[j], ++j) {
    if (per_expert[j] == 0) continue;
    outputs.push_back(experts_[first + j]->as<Expert>()->forward(rows.narrow(0, offset, per_expert[j])));
  }
  // With no rows here, the empty `received` keeps both all_to_alls in the
  // autograd graph, so this rank still takes part in their backward.
  const at::Tensor expert_out = outputs.empty() ? received : at::cat(outputs, 0);
  const at::Tensor inverse = at::empty_like(perm_t).index_put_({perm_t}, at::arange(received_total, order.options()));
  const at::Tensor back = parallel_->AllToAll(expert_out.index_select(0, inverse), recv_rows, send_rows);
  return at::zeros_like(flat).index_add(0, slot_tokens, back * weights.index_select(0, order));
}

}  // namespace moerr::moe
