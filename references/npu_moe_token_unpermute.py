"""torch_npu.npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, bool padded_mode=False, int[]? restore_shape=None) -> Tensor.

Semantics (CANN aclnnMoeTokenUnpermute, padded_mode false): with topK =
probs.size(1) (1 without probs), T[k] = permuted_tokens[sorted_indices[k]],
scaled by probs[k // topK][k % topK] when given, and
out[i] = sum over k in [i*topK, (i+1)*topK) of T[k]. Rows of a permutation
cut by num_out_tokens (sorted_indices past the permuted rows) add zero.
Summed in fp32 (or the input's wider dtype); out in permuted_tokens' dtype.
"""
from typing import List, Optional

import torch
from torch import Tensor


class NpuMoeTokenUnpermute(torch.nn.Module):
    def forward(self, permuted_tokens: Tensor, sorted_indices: Tensor, probs: Optional[Tensor],
                padded_mode: bool, restore_shape: Optional[List[int]]) -> Tensor:
        if padded_mode:
            raise RuntimeError("npu_moe_token_unpermute: padded_mode is not supported by torch_npu either")
        ct = torch.promote_types(permuted_tokens.dtype, torch.float32)
        rows = sorted_indices.numel()
        t = permuted_tokens.to(ct)
        if t.size(0) < rows:  # dropped tokens: zero rows
            t = torch.cat([t, t.new_zeros([rows - t.size(0), t.size(1)])], 0)
        t = t.index_select(0, sorted_indices.reshape(-1).to(torch.int64))
        topk = 1
        if probs is not None:
            topk = probs.size(1)
            t = t * probs.to(ct).reshape(-1, 1)
        out = t.reshape(rows // topk, topk, t.size(1)).sum(1)
        return out.to(permuted_tokens.dtype)


OP = "npu::npu_moe_token_unpermute"
MODULE = NpuMoeTokenUnpermute
ULPS = 4
