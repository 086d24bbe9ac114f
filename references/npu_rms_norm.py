"""torch_npu.npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor).

Semantics (torch_npu API reference, npu_rms_norm): over the last gamma.dim()
dimensions of `self`, rstd = 1 / sqrt(mean(x^2) + epsilon) and
y = x * rstd * gamma. Returns (y in the input's dtype, rstd with those
dimensions kept as 1, in fp32). Computed in fp32 (or the input's wider dtype).
"""
from typing import List, Tuple

import torch
from torch import Tensor


class NpuRmsNorm(torch.nn.Module):
    def forward(self, x: Tensor, gamma: Tensor, epsilon: float) -> Tuple[Tensor, Tensor]:
        ct = torch.promote_types(x.dtype, torch.float32)
        dims: List[int] = list(range(x.dim() - gamma.dim(), x.dim()))
        xf = x.to(ct)
        rstd = torch.rsqrt(torch.mean(xf * xf, dims, keepdim=True) + epsilon)
        y = xf * rstd * gamma.to(ct)
        return y.to(x.dtype), rstd


OP = "npu::npu_rms_norm"
MODULE = NpuRmsNorm
ULPS = 8
