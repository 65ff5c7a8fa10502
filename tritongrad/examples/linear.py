"""Seed 000's ``CustomLinear``, with only the forward kernel: ``@tritongrad.op`` derives the backward.

The seed wrote ``fwd_kernel`` and ``bwd_kernel`` by hand and wired them into a
``torch.autograd.Function``. Here the host launcher of the seed's forward kernel
(``matvec.fwd_kernel``) is the whole operator.
"""

import torch
import triton
from torch import nn

from ..ops.torch_op import op
from . import matvec
from .launch import row_block
from .matvec import BS, fwd_kernel

KERNELS = (fwd_kernel,)


@op("tritongrad_examples::linear")
def linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``w @ x`` for a matrix ``w`` (m, n) and a vector ``x`` (n)."""
    w, x = w.contiguous(), x.contiguous()
    m, n = w.shape
    out = torch.empty(m, device=w.device, dtype=w.dtype)
    fwd_kernel[(triton.cdiv(m, BS),)](w, x, out, m, n, bs=BS, bn=row_block(n))
    return out


class CustomLinear(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.weights = nn.Parameter(torch.randn(cout, cin) / cin**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.weights, x)


# the same computation as matvec's launcher: its reference, inputs, sizes and traffic
reference, make_inputs, traffic = matvec.reference, matvec.make_inputs, matvec.traffic
SIZES, BENCH_SIZES, DTYPES = matvec.SIZES, matvec.BENCH_SIZES, matvec.DTYPES
