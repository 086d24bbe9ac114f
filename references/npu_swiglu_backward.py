"""torch_npu.npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor.

The gradient of npu_swiglu with respect to its input: with A, B the halves
of `self` along `dim`, s = sigmoid(A), the gradient is
cat(g * B * s * (1 + A * (1 - s)), g * A * s) along `dim`.
"""
import torch
from torch import Tensor


class NpuSwigluBackward(torch.nn.Module):
    def forward(self, grad_output: Tensor, x: Tensor, dim: int) -> Tensor:
        ct = torch.promote_types(x.dtype, torch.float32)
        a, b = torch.chunk(x.to(ct), 2, dim)
        g = grad_output.to(ct)
        s = torch.sigmoid(a)
        da = g * b * s * (1.0 + a * (1.0 - s))
        db = g * a * s
        return torch.cat([da, db], dim).to(x.dtype)


OP = "npu::npu_swiglu_backward"
MODULE = NpuSwigluBackward
ULPS = 4
