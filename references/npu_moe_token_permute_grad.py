"""torch_npu.npu_moe_token_permute_grad(Tensor tokens, Tensor grad_permuted_tokens, Tensor indices, Tensor sorted_indices, bool padded_mode=False) -> Tensor.

The schema of torch_npu 7.2.0 to 26.0.0 (op-plugin's op_plugin_functions.yaml;
derivatives.yaml makes it the gradient of npu_moe_token_permute at `tokens`).
Semantics (CANN aclnnMoeTokenPermuteGrad, padded_mode false): the transpose of
the permute's gather. With topK = indices.size(1) (1 for 1-D indices),
grad_tokens[i] = sum over k in [i*topK, (i+1)*topK) of
grad_permuted_tokens[sorted_indices[k]]; a slot whose row was cut by
num_out_tokens (sorted_indices[k] >= grad_permuted_tokens.size(0)) adds zero.
Shape [tokens.size(0), H], in tokens' dtype; summed in fp32 (or the input's
wider dtype). `tokens` gives only the shape and dtype.
"""
import torch
from torch import Tensor


class NpuMoeTokenPermuteGrad(torch.nn.Module):
    def forward(self, tokens: Tensor, grad_permuted_tokens: Tensor, indices: Tensor, sorted_indices: Tensor,
                padded_mode: bool = False) -> Tensor:
        if padded_mode:
            raise RuntimeError("npu_moe_token_permute_grad: padded_mode is not supported by torch_npu either")
        ct = torch.promote_types(grad_permuted_tokens.dtype, torch.float32)
        topk = 1 if indices.dim() == 1 else indices.size(1)
        slots = sorted_indices.numel()
        g = grad_permuted_tokens.to(ct)
        if g.size(0) < slots:  # dropped tokens: zero rows
            g = torch.cat([g, g.new_zeros([slots - g.size(0), g.size(1)])], 0)
        g = g.index_select(0, sorted_indices.reshape(-1).to(torch.int64))
        return g.reshape(tokens.size(0), topk, g.size(1)).sum(1).to(tokens.dtype)


OP = "npu::npu_moe_token_permute_grad"
MODULE = NpuMoeTokenPermuteGrad
ULPS = 4
