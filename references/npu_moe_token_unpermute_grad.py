"""torch_npu.npu_moe_token_unpermute_grad(Tensor permuted_tokens, Tensor grad_unpermuted_tokens, Tensor sorted_indices, Tensor? probs=None, bool padded_mode=False, int[]? restore_shape=None) -> (Tensor, Tensor).

The schema of torch_npu 7.2.0 to 26.0.0 (op-plugin's op_plugin_functions.yaml;
derivatives.yaml makes it the gradient of npu_moe_token_unpermute at
permuted_tokens and probs). Semantics (CANN aclnnMoeTokenUnpermuteGrad,
padded_mode false), the gradients of out[i] = sum_j probs[i, j] *
permuted_tokens[sorted_indices[i*topK + j]] (topK = probs.size(1), 1 and
weight 1 without probs):
  grad_permuted_tokens[sorted_indices[k]] = probs[k // topK, k % topK] *
    grad_unpermuted_tokens[k // topK], rows no slot reads zero, shaped and
    typed as permuted_tokens;
  grad_probs[i, j] = <grad_unpermuted_tokens[i], permuted_tokens[sorted_indices[i*topK + j]]>
    (0 for a slot cut by num_out_tokens), shaped and typed as probs.
Without probs torch_npu's second output is a 0-dim tensor the kernel does not
write (op-plugin allocates it with shape []); the reference returns 0 there.
Summed in fp32 (or the input's wider dtype).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor


class NpuMoeTokenUnpermuteGrad(torch.nn.Module):
    def forward(self, permuted_tokens: Tensor, grad_unpermuted_tokens: Tensor, sorted_indices: Tensor,
                probs: Optional[Tensor] = None, padded_mode: bool = False,
                restore_shape: Optional[List[int]] = None) -> Tuple[Tensor, Tensor]:
        if padded_mode:
            raise RuntimeError("npu_moe_token_unpermute_grad: padded_mode is not supported by torch_npu either")
        ct = torch.promote_types(permuted_tokens.dtype, torch.float32)
        slots = sorted_indices.numel()
        rows = permuted_tokens.size(0)
        topk = 1 if probs is None else probs.size(1)
        g = grad_unpermuted_tokens.to(ct).repeat_interleave(topk, 0)  # slot k reads output row k // topK
        weighted = g if probs is None else g * probs.to(ct).reshape(-1, 1)
        index = sorted_indices.reshape(-1).to(torch.int64)
        grad_permuted = g.new_zeros([max(rows, slots), g.size(1)]).index_copy(0, index, weighted)[:rows]
        if probs is None:
            return grad_permuted.to(permuted_tokens.dtype), grad_unpermuted_tokens.new_zeros([])
        t = permuted_tokens.to(ct)
        if rows < slots:  # dropped tokens: zero rows
            t = torch.cat([t, t.new_zeros([slots - rows, t.size(1)])], 0)
        grad_probs = (t.index_select(0, index) * g).sum(1).reshape(probs.shape)
        return grad_permuted.to(permuted_tokens.dtype), grad_probs.to(probs.dtype)


OP = "npu::npu_moe_token_unpermute_grad"
MODULE = NpuMoeTokenUnpermuteGrad
ULPS = 8
