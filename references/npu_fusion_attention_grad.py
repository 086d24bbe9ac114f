"""torch_npu.npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int seed=0, int offset=0, int numels=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, str softmax_layout="", Tensor? sink=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor).

The schema of torch_npu 7.3.0 and 26.0.0 (op-plugin branches 7.3.0 and
26.0.0). Calls recorded with 7.0.0 to 7.2.0 lack `softmax_layout` and
`sink`, take their defaults, and have four outputs: the fifth, dsink, is
empty without `sink`, and replay drops it.

The gradients of npu_fusion_attention (npu_fusion_attention.py, whose
layouts, masks and refusals it shares) at query, key, value for the output
gradient dy: with P = softmax(S) recomputed from query and key (the saved
softmax_max, softmax_sum, softmax_in and attention_in are not read),
dV = P^T dy, dS = P * (dy V^T - rowsum(P * dy V^T)), dQ = scale * dS K,
dK = scale * dS^T Q; a key/value head shared by several query heads sums
their gradients. Returns dq, dk, dv in their inputs' layouts and dtypes,
dpse (empty without pse, in the query's dtype) and dsink (empty without
sink, fp32).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from npu_fusion_attention import check_supported, from_bnsd, head_size, masked, scores, softmax_parts, to_bnsd


def sum_groups(x: Tensor, kv_heads: int) -> Tensor:
    """[B, N_q, S, D] summed over the query heads sharing each of `kv_heads` heads."""
    return x.reshape(x.size(0), kv_heads, x.size(1) // kv_heads, x.size(2), x.size(3)).sum(2)


class NpuFusionAttentionGrad(torch.nn.Module):
    def forward(self, query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int, input_layout: str,
                pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                atten_mask: Optional[Tensor] = None, softmax_max: Optional[Tensor] = None,
                softmax_sum: Optional[Tensor] = None, softmax_in: Optional[Tensor] = None,
                attention_in: Optional[Tensor] = None, scale_value: float = 1.0, keep_prob: float = 1.0,
                pre_tockens: int = 2147483647, next_tockens: int = 2147483647, inner_precise: int = 0,
                seed: int = 0, offset: int = 0, numels: int = 0, prefix: Optional[List[int]] = None,
                actual_seq_qlen: Optional[List[int]] = None, actual_seq_kvlen: Optional[List[int]] = None,
                sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False,
                softmax_layout: str = "", sink: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        layout = check_supported(input_layout, pse, padding_mask, keep_prob, prefix, actual_seq_qlen,
                                 actual_seq_kvlen, sparse_mode, softmax_layout, sink)
        ct = torch.promote_types(query.dtype, torch.float32)
        d = head_size(query, layout, head_num)
        dv_size = value.size(-1) * d // key.size(-1) if layout in ["BSH", "SBH"] else 0
        q = to_bnsd(query.to(ct), layout, d)
        k = to_bnsd(key.to(ct), layout, d)
        v = to_bnsd(value.to(ct), layout, dv_size)
        g = to_bnsd(dy.to(ct), layout, dv_size)
        group = q.size(1) // k.size(1)
        mask = masked(atten_mask, sparse_mode, pre_tockens, next_tockens, q.size(2), k.size(2), query.device)
        p = softmax_parts(scores(q, k, scale_value, mask))[0]
        dp = torch.matmul(g, v.repeat_interleave(group, 1).transpose(-1, -2))
        ds = p * (dp - (p * dp).sum(-1, keepdim=True))
        dq = torch.matmul(ds, k.repeat_interleave(group, 1)) * scale_value
        dk = sum_groups(torch.matmul(ds.transpose(-1, -2), q) * scale_value, k.size(1))
        dv = sum_groups(torch.matmul(p.transpose(-1, -2), g), v.size(1))
        return (from_bnsd(dq, layout).to(query.dtype), from_bnsd(dk, layout).to(key.dtype),
                from_bnsd(dv, layout).to(value.dtype), query.new_empty([0]),
                query.new_empty([0], dtype=torch.float32))


OP = "npu::npu_fusion_attention_grad"
MODULE = NpuFusionAttentionGrad
ULPS = 16
