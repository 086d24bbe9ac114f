"""torch_npu.npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, str softmax_layout="", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int).

The schema of torch_npu 26.0.0 (op-plugin branch 26.0.0,
op_plugin_functions.yaml). Calls recorded with 7.0.0 to 7.3.0, whose
schemas stop after `sync`, `softmax_layout` or `sink`, take the defaults of
the arguments they lack.

Semantics (torch_npu API reference, npu_fusion_attention, and op-plugin's
FlashAttentionKernelNpuOpApi.cpp for the output shapes): per head,
S = scale * Q K^T over the last dimension D, masked, P = softmax(S) over the
keys, attention_out = P V. Q, K, V are in `input_layout` (case-insensitive):
BSH and SBH (H = N * D, D = H_q / head_num), BSND or BNSD. N_q / N_kv
query heads share each key/value head (GQA: query head h reads key head
h // (N_q / N_kv)). Masks, where atten_mask is given (without it nothing is
masked, whatever sparse_mode, pre_tockens and next_tockens say):
  sparse_mode 0: atten_mask (True: masked), and outside the band
    i - pre_tockens <= j <= i + next_tockens (origin top-left);
  1: atten_mask alone;  2: j > i (leftUpCausal);
  3: j > i + Skv - Sq (rightDownCausal);
  4: the band above with its origin at the bottom-right (i + Skv - Sq).
  Modes 2 to 4 take atten_mask as the kernel's compressed 2048x2048 tile and
  do not read it.
Outputs: attention_out in the layout, [.., head_num * Dv] or [.., Dv], in the
query's dtype; softmax_max and softmax_sum, the row maximum of S and the sum
of exp(S - max), [B, N, Sq, 8] (the value repeated 8 times) in fp32;
softmax_out, reserved: an empty tensor; seed, offset, numels: 0 (no
dropout). A query row whose keys are all masked has out 0, max -inf and
sum 0 (the published semantics do not define it).

Refused with an error: pse, padding_mask, prefix, actual_seq_qlen/kvlen
(TND), sink, dropout_mask, keep_prob < 1, sparse_mode 5 to 8, a
softmax_layout, the TND and other layouts. inner_precise (a precision mode)
is not read. Computed in fp32 (or the input's wider dtype).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor


def check_supported(input_layout: str, pse: Optional[Tensor], padding_mask: Optional[Tensor], keep_prob: float,
                    prefix: Optional[List[int]], actual_seq_qlen: Optional[List[int]],
                    actual_seq_kvlen: Optional[List[int]], sparse_mode: int, softmax_layout: str,
                    sink: Optional[Tensor]) -> str:
    """The upper-cased layout, or an error naming what the reference does not implement."""
    layout = input_layout.upper()
    if layout not in ["BSH", "SBH", "BSND", "BNSD"]:
        raise RuntimeError("npu_fusion_attention reference: input_layout " + input_layout
                           + " is not implemented (BSH, SBH, BSND, BNSD are)")
    if pse is not None or padding_mask is not None or sink is not None:
        raise RuntimeError("npu_fusion_attention reference: pse, padding_mask and sink are not implemented")
    if keep_prob != 1.0:
        raise RuntimeError("npu_fusion_attention reference: keep_prob < 1 (dropout) is not implemented")
    if prefix is not None or actual_seq_qlen is not None or actual_seq_kvlen is not None:
        raise RuntimeError("npu_fusion_attention reference: prefix and actual_seq_qlen/kvlen are not implemented")
    if sparse_mode < 0 or sparse_mode > 4:
        raise RuntimeError("npu_fusion_attention reference: sparse_mode " + str(sparse_mode)
                           + " is not implemented (0 to 4 are)")
    if softmax_layout != "":
        raise RuntimeError("npu_fusion_attention reference: softmax_layout is not implemented")
    return layout


def to_bnsd(x: Tensor, layout: str, d: int) -> Tensor:
    """`x` in `layout` as [B, N, S, D'], D' = x's head size (`d` for BSH/SBH)."""
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    if layout == "BSH":
        return x.reshape(x.size(0), x.size(1), x.size(2) // d, d).permute(0, 2, 1, 3)
    return x.reshape(x.size(0), x.size(1), x.size(2) // d, d).permute(1, 2, 0, 3)  # SBH


def from_bnsd(x: Tensor, layout: str) -> Tensor:
    """[B, N, S, D] back to `layout` (the inverse of to_bnsd)."""
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    if layout == "BSH":
        return x.permute(0, 2, 1, 3).reshape(x.size(0), x.size(2), x.size(1) * x.size(3))
    return x.permute(2, 0, 1, 3).reshape(x.size(2), x.size(0), x.size(1) * x.size(3))  # SBH


def head_size(query: Tensor, layout: str, head_num: int) -> int:
    return query.size(2) // head_num if layout == "BSH" or layout == "SBH" else query.size(3)


def masked(atten_mask: Optional[Tensor], sparse_mode: int, pre: int, nxt: int, sq: int, skv: int,
           device: torch.device) -> Optional[Tensor]:
    """The masked positions, broadcastable to [B, N, Sq, Skv] (True: masked); None: none."""
    if atten_mask is None:
        return None
    i = torch.arange(sq, device=device).reshape(sq, 1)
    j = torch.arange(skv, device=device).reshape(1, skv)
    if sparse_mode == 1:
        return atten_mask.to(torch.bool)
    if sparse_mode == 2:
        return j > i
    if sparse_mode == 3:
        return j > i + (skv - sq)
    if sparse_mode == 4:
        diagonal = i + (skv - sq)
        return (j > diagonal + nxt) | (j < diagonal - pre)
    return atten_mask.to(torch.bool) | (j > i + nxt) | (j < i - pre)


def scores(q: Tensor, k: Tensor, scale: float, mask: Optional[Tensor]) -> Tensor:
    """scale * Q K^T in [B, N, Sq, Skv], masked positions -inf; K's heads shared by N_q / N_kv query heads."""
    group = q.size(1) // k.size(1)
    s = torch.matmul(q, k.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    return s


def softmax_parts(s: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(P, row max, row sum of exp(S - max)); rows with every key masked: P 0, max -inf, sum 0."""
    row_max = s.amax(-1, keepdim=True)
    finite_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(s - finite_max)
    row_sum = e.sum(-1, keepdim=True)
    p = e / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)
    return p, row_max, row_sum


class NpuFusionAttention(torch.nn.Module):
    def forward(self, query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                atten_mask: Optional[Tensor] = None, scale: float = 1.0, keep_prob: float = 1.0,
                pre_tockens: int = 2147483647, next_tockens: int = 2147483647, inner_precise: int = 0,
                prefix: Optional[List[int]] = None, actual_seq_qlen: Optional[List[int]] = None,
                actual_seq_kvlen: Optional[List[int]] = None, sparse_mode: int = 0,
                gen_mask_parallel: bool = True, sync: bool = False, softmax_layout: str = "",
                sink: Optional[Tensor] = None, dropout_mask: Optional[Tensor] = None, seed: int = 0,
                offset: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor, int, int, int]:
        layout = check_supported(input_layout, pse, padding_mask, keep_prob, prefix, actual_seq_qlen,
                                 actual_seq_kvlen, sparse_mode, softmax_layout, sink)
        if dropout_mask is not None:
            raise RuntimeError("npu_fusion_attention reference: dropout_mask is not implemented")
        ct = torch.promote_types(query.dtype, torch.float32)
        d = head_size(query, layout, head_num)
        q = to_bnsd(query.to(ct), layout, d)
        k = to_bnsd(key.to(ct), layout, d)
        v = to_bnsd(value.to(ct), layout, value.size(-1) * d // key.size(-1) if layout in ["BSH", "SBH"] else 0)
        mask = masked(atten_mask, sparse_mode, pre_tockens, next_tockens, q.size(2), k.size(2), query.device)
        p, row_max, row_sum = softmax_parts(scores(q, k, scale, mask))
        out = torch.matmul(p, v.repeat_interleave(q.size(1) // v.size(1), 1))
        stats = [q.size(0), q.size(1), q.size(2), 8]
        return (from_bnsd(out, layout).to(query.dtype), row_max.expand(stats).contiguous(),
                row_sum.expand(stats).contiguous(), query.new_empty([0]), 0, 0, 0)


OP = "npu::npu_fusion_attention"
MODULE = NpuFusionAttention
ULPS = 16
