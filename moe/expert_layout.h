// The two layouts of a MoE block's routed experts in an HF checkpoint.
//
// Per expert (what transformers 4 keeps and transformers 5's save_pretrained
// writes by default, and moerr's model's own names):
//   model.layers.L.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight
//   (Mixtral: model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight)
// Fused (transformers 5's in-memory layout, written by
// save_pretrained(save_original_format=False)), in every family under mlp.:
//   model.layers.L.mlp.experts.gate_up_proj [experts, 2 * moe_intermediate_size, hidden_size]
//       (expert e's gate_proj rows, then its up_proj rows)
//   model.layers.L.mlp.experts.down_proj    [experts, hidden_size, moe_intermediate_size]
//   and Mixtral's router as model.layers.L.mlp.gate.weight.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "formats/tensor_view.h"
#include "moe/moe_config.h"

namespace moerr::moe {

// True for the name of a fused experts tensor ("model.layers.L.mlp.experts.gate_up_proj" or ".down_proj").
bool IsFusedExpertsName(const std::string& name);

// `tensors` with every fused experts tensor replaced by per-expert views of
// its bytes (no copy; they borrow what the fused view borrows) under moerr's
// names, and Mixtral's mlp.* renamed block_sparse_moe.*. Tensors in the
// per-expert layout pass unchanged. InvalidArgument naming the tensor, the
// layer and the expected shape for a fused tensor of the wrong rank or
// shape, of a layer that is not a MoE layer of `config`, or whose experts
// the checkpoint also holds one by one.
absl::StatusOr<std::map<std::string, formats::TensorView>> SplitFusedExperts(
    const MoeConfig& config, std::map<std::string, formats::TensorView> tensors);

}  // namespace moerr::moe
