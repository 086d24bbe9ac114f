"""torch_npu.npu_swiglu(Tensor self, int dim=-1) -> Tensor.

Semantics (torch_npu API reference, npu_swiglu): the input is split into two
halves A, B along `dim`; the output is Swish(A) * B, Swish(A) = A * sigmoid(A).
Computed in fp32 (or the input's wider dtype), returned in the input's dtype.
"""
import torch
from torch import Tensor


class NpuSwiglu(torch.nn.Module):
    def forward(self, x: Tensor, dim: int) -> Tensor:
        ct = torch.promote_types(x.dtype, torch.float32)
        a, b = torch.chunk(x.to(ct), 2, dim)
        return (torch.nn.functional.silu(a) * b).to(x.dtype)


OP = "npu::npu_swiglu"
MODULE = NpuSwiglu
ULPS = 4
