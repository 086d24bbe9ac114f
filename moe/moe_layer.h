// A MoE block: router, routed experts, optional shared experts. Dispatch
// groups tokens by expert (a stable sort of the flat top-k ids, index_select,
// one index_add), so each expert runs on its own tokens only. With a
// Parallel set (parallel.h), the experts are spread over the EP group and
// dispatch goes through all_to_all (ExpertParallelForward).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <vector>

#include "moe/layers.h"
#include "moe/parallel.h"
#include "moe/router.h"

namespace moerr::moe {

class MoeLayerImpl : public torch::nn::Module {
 public:
  MoeLayerImpl(const MoeConfig& config, int64_t layer, std::string path);
  at::Tensor forward(const at::Tensor& x);  // [B, S, hidden] -> same

  Router& gate() { return gate_; }
  Expert expert(int64_t e) { return Expert(experts_->ptr<ExpertImpl>(e)); }
  // Load-balancing loss of the last forward: E * sum_e f_e * P_e, where f_e
  // is the share of routed slots expert e got and P_e its mean probability.
  const at::Tensor& aux_loss() const { return aux_loss_; }
  // Tokens per expert in the last forward, [E] int64.
  // Under expert parallelism, over the whole world's batch.
  const at::Tensor& expert_counts() const { return counts_; }
  // Null: every expert runs here. Otherwise only this rank's experts run
  // (the others' weights are left untouched) and every forward is a
  // collective over the EP group and the world.
  void set_parallel(Parallel* parallel) { parallel_ = parallel; }

 private:
  MoeConfig config_;
  std::string path_;
  Router gate_{nullptr};
  torch::nn::ModuleList experts_;
  Expert shared_{nullptr};
  torch::nn::Linear shared_gate_{nullptr};
  at::Tensor aux_loss_, counts_;
  Parallel* parallel_ = nullptr;

  // The routed experts' output [T, hidden] for `flat` [T, hidden] routed to
  // slots of `weights` [T*k, 1] (token token_of_slot[s] for slot s; the
  // slots sorted by expert in `order`).
  at::Tensor LocalForward(const at::Tensor& flat, const at::Tensor& weights, const at::Tensor& token_of_slot,
                          const at::Tensor& order);
  at::Tensor ExpertParallelForward(const at::Tensor& flat, const at::Tensor& weights,
                                   const at::Tensor& token_of_slot, const at::Tensor& order);
};
TORCH_MODULE(MoeLayer);

}  // namespace moerr::moe
