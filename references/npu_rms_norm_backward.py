"""torch_npu.npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor).

The gradients of npu_rms_norm given its saved rstd: with xhat = x * rstd over
the last gamma.dim() dimensions (mean over them: mean_n),
dx = rstd * (dy * gamma - xhat * mean_n(dy * gamma * xhat)) in the input's
dtype, and dgamma = the sum of dy * xhat over the leading dimensions, in fp32.
"""
from typing import List, Tuple

import torch
from torch import Tensor


class NpuRmsNormBackward(torch.nn.Module):
    def forward(self, dy: Tensor, x: Tensor, gamma: Tensor, rstd: Tensor) -> Tuple[Tensor, Tensor]:
        ct = torch.promote_types(x.dtype, torch.float32)
        norm_dims: List[int] = list(range(x.dim() - gamma.dim(), x.dim()))
        lead_dims: List[int] = list(range(0, x.dim() - gamma.dim()))
        r = rstd.to(ct)
        xhat = x.to(ct) * r
        dyg = dy.to(ct) * gamma.to(ct)
        dx = r * (dyg - xhat * torch.mean(dyg * xhat, norm_dims, keepdim=True))
        dgamma = dy.to(ct) * xhat
        if len(lead_dims) > 0:
            dgamma = torch.sum(dgamma, lead_dims)
        return dx.to(x.dtype), dgamma


OP = "npu::npu_rms_norm_backward"
MODULE = NpuRmsNormBackward
ULPS = 8
