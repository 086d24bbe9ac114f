"""torch_npu.npu_rotary_mul(Tensor self, Tensor r1, Tensor r2) -> Tensor.

Semantics (torch_npu API reference, npu_rotary_mul, rotary_mode 'half', the
default): x1, x2 = chunk(x, 2, -1); output = r1 * x + r2 * cat(-x2, x1), r1
and r2 (cos, sin) broadcast to x. Newer torch_npu adds `str rotary_mode`; a
recorded call with it passes the tensors alone, and 'half' is assumed.
"""
import torch
from torch import Tensor


class NpuRotaryMul(torch.nn.Module):
    def forward(self, x: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
        ct = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(ct)
        x1, x2 = torch.chunk(xf, 2, -1)
        rotated = torch.cat([-x2, x1], -1)
        return (r1.to(ct) * xf + r2.to(ct) * rotated).to(x.dtype)


OP = "npu::npu_rotary_mul"
MODULE = NpuRotaryMul
ULPS = 4
