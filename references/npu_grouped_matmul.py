"""torch_npu.npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, Tensor? group_list=None, Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, int? group_list_type=0, int? act_type=0, int[]? tuning_config=None, int? output_dtype=None, int? x_dtype=None, int? weight_dtype=None, int? scale_dtype=None, int? per_token_scale_dtype=None) -> Tensor[].

The schema of torch_npu 26.0.0 (op-plugin branch 26.0.0); calls recorded
with 7.1.0 to 7.3.0, whose schema stops at output_dtype, take the defaults of
the last four. Not served: 7.0.0's schemas and the `.List` overload (int[]
group_list), whose arguments after group_list differ.

Semantics (torch_npu API reference, npu_grouped_matmul, formula 1, without
quantisation): y_i = x_i @ weight_i + bias_i for each group i.
  * group_type None or -1 (no grouping axis): x and weight are lists of g
    tensors; group i is x[i] (2-D to 6-D) @ weight[i] (2-D).
  * group_type 0 (the M axis): the rows of x (one 2-D tensor, or the
    concatenation of a list) are split into groups by group_list, a tensor
    of cumulative row counts (group_list_type 0) or of counts (1); group i
    multiplies by weight[i] (a list of 2-D [K, N]) or weight[0][i] (one
    3-D [E, K, N]). Rows past the last group are 0.
  * bias: one 1-D [N] per weight tensor, or one [E, N] beside a 3-D weight.
  * split_item 0 or 1: one output per group; 2 or 3: the groups' outputs
    concatenated along the rows, one tensor.
Outputs in x's dtype (the replay casts them to the recorded dtypes, which
output_dtype chose); computed in fp32 (or the input's wider dtype).
Refused with an error: the quantisation arguments (scale, offset,
antiquant_*, per_token_scale, activation_*, *_dtype), act_type other than 0,
group_type 2 (the K axis), group_list_type 2, and integer inputs.
"""
from typing import List, Optional

import torch
from torch import Tensor


def group_rows(group_list: Tensor, group_list_type: int, groups: int) -> List[int]:
    """The row count of each of `groups` groups."""
    values: List[int] = group_list.to(torch.int64).tolist()
    if group_list_type == 1:
        return values
    counts: List[int] = []
    previous = 0
    for end in values:
        counts.append(end - previous)
        previous = end
    return counts


def check_supported(x: List[Tensor], quantised: List[Optional[List[Tensor]]], act_type: int,
                    group_type: int, group_list_type: int, dtypes: List[Optional[int]]):
    for q in quantised:
        if q is not None:
            raise RuntimeError("npu_grouped_matmul reference: quantisation arguments are not implemented")
    for t in dtypes:
        if t is not None:
            raise RuntimeError("npu_grouped_matmul reference: x_dtype, weight_dtype, scale_dtype and "
                               "per_token_scale_dtype are not implemented")
    if act_type != 0:
        raise RuntimeError("npu_grouped_matmul reference: act_type " + str(act_type) + " is not implemented")
    if group_type != -1 and group_type != 0:
        raise RuntimeError("npu_grouped_matmul reference: group_type " + str(group_type)
                           + " is not implemented (None, -1 and 0 are)")
    if group_list_type != 0 and group_list_type != 1:
        raise RuntimeError("npu_grouped_matmul reference: group_list_type " + str(group_list_type)
                           + " is not implemented (0 and 1 are)")
    for t in x:
        if not t.is_floating_point():
            raise RuntimeError("npu_grouped_matmul reference: integer (quantised) inputs are not implemented")


class NpuGroupedMatmul(torch.nn.Module):
    def forward(self, x: List[Tensor], weight: List[Tensor], bias: Optional[List[Tensor]] = None,
                scale: Optional[List[Tensor]] = None, offset: Optional[List[Tensor]] = None,
                antiquant_scale: Optional[List[Tensor]] = None, antiquant_offset: Optional[List[Tensor]] = None,
                per_token_scale: Optional[List[Tensor]] = None, group_list: Optional[Tensor] = None,
                activation_input: Optional[List[Tensor]] = None,
                activation_quant_scale: Optional[List[Tensor]] = None,
                activation_quant_offset: Optional[List[Tensor]] = None, split_item: Optional[int] = 0,
                group_type: Optional[int] = None, group_list_type: Optional[int] = 0,
                act_type: Optional[int] = 0, tuning_config: Optional[List[int]] = None,
                output_dtype: Optional[int] = None, x_dtype: Optional[int] = None,
                weight_dtype: Optional[int] = None, scale_dtype: Optional[int] = None,
                per_token_scale_dtype: Optional[int] = None) -> List[Tensor]:
        gtype = -1 if group_type is None else group_type
        ltype = 0 if group_list_type is None else group_list_type
        split = 0 if split_item is None else split_item
        check_supported(x, [scale, offset, antiquant_scale, antiquant_offset, per_token_scale, activation_input,
                            activation_quant_scale, activation_quant_offset],
                        0 if act_type is None else act_type, gtype, ltype,
                        [x_dtype, weight_dtype, scale_dtype, per_token_scale_dtype])
        ct = torch.promote_types(x[0].dtype, torch.float32)
        weights = [w.to(ct) for w in weight]
        if len(weights) == 1 and weights[0].dim() == 3:
            weights = [w for w in weights[0].unbind(0)]
        biases: List[Tensor] = []
        if bias is not None:
            for b in bias:
                biases.extend([r for r in b.to(ct).reshape(-1, b.size(-1)).unbind(0)])
        inputs: List[Tensor] = []
        if gtype == 0:
            rows = torch.cat([t.to(ct) for t in x], 0)
            if group_list is None:
                counts = [t.size(0) for t in x]
            else:
                counts = group_rows(group_list, ltype, len(weights))
            inputs = list(rows.split(counts + [rows.size(0) - sum(counts)], 0))
        else:
            inputs = [t.to(ct) for t in x]
        out: List[Tensor] = []
        for i in range(len(weights)):
            y = torch.matmul(inputs[i], weights[i])
            if len(biases) > 0:
                y = y + biases[i]
            out.append(y.to(x[0].dtype))
        if gtype == 0 and inputs[-1].size(0) > 0 and len(inputs) > len(weights):
            out.append(inputs[-1].new_zeros([inputs[-1].size(0), weights[0].size(1)]).to(x[0].dtype))
        if split == 2 or split == 3:
            return [torch.cat(out, 0)]
        if gtype == 0 and len(out) > len(weights):
            out = out[:len(weights)]
        return out


OP = "npu::npu_grouped_matmul"
MODULE = NpuGroupedMatmul
ULPS = 8
