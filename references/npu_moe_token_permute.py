"""torch_npu.npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, bool padded_mode=False) -> (Tensor, Tensor).

Semantics (CANN aclnnMoeTokenPermute, padded_mode false, the only mode
supported): with topK = indices.size(1) (1 for 1-D indices),
first = argsort(flatten(indices)) (stable: tokens routed to one expert keep
their order), sorted_indices = argsort(first) as int32, and
permuted[sorted_indices[i]] = tokens[i // topK], i.e.
permuted[j] = tokens[first[j] // topK]; only the first num_out_tokens rows
are kept when it is given and positive (dropped tokens).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


class NpuMoeTokenPermute(torch.nn.Module):
    def forward(self, tokens: Tensor, indices: Tensor, num_out_tokens: Optional[int],
                padded_mode: bool) -> Tuple[Tensor, Tensor]:
        if padded_mode:
            raise RuntimeError("npu_moe_token_permute: padded_mode is not supported by torch_npu either")
        topk = 1 if indices.dim() == 1 else indices.size(1)
        first = torch.sort(indices.reshape(-1), stable=True)[1]
        sorted_indices = torch.sort(first, stable=True)[1].to(torch.int32)
        rows = first.numel()
        if num_out_tokens is not None:
            if num_out_tokens > 0:
                rows = min(rows, num_out_tokens)
        permuted = tokens.index_select(0, torch.div(first[:rows], topk, rounding_mode="floor"))
        return permuted, sorted_indices


OP = "npu::npu_moe_token_permute"
MODULE = NpuMoeTokenPermute
ULPS = 0
