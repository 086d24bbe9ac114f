"""torch_npu.npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2) -> (Tensor, Tensor, Tensor).

The gradients of npu_rotary_mul ('half' mode): with g1, g2 = chunk(grad * r2,
2, -1), dx = grad * r1 + cat(g2, -g1) (the transpose of the rotation);
dr1 = grad * x and dr2 = grad * cat(-x2, x1), each summed over the
dimensions r1 and r2 were broadcast along. Each in its input's dtype.
"""
from typing import Tuple

import torch
from torch import Tensor


class NpuRotaryMulBackward(torch.nn.Module):
    def forward(self, grad: Tensor, x: Tensor, r1: Tensor, r2: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        ct = torch.promote_types(x.dtype, torch.float32)
        g = grad.to(ct)
        xf = x.to(ct)
        g1, g2 = torch.chunk(g * r2.to(ct), 2, -1)
        dx = g * r1.to(ct) + torch.cat([g2, -g1], -1)
        x1, x2 = torch.chunk(xf, 2, -1)
        dr1 = (g * xf).sum_to_size(r1.shape)
        dr2 = (g * torch.cat([-x2, x1], -1)).sum_to_size(r2.shape)
        return dx.to(x.dtype), dr1.to(r1.dtype), dr2.to(r2.dtype)


OP = "npu::npu_rotary_mul_backward"
MODULE = NpuRotaryMulBackward
ULPS = 4
