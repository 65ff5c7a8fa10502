"""Seed 000's ``CustomLinear``, with only the forward kernel: ``@tritongrad.op`` derives the backward.

The seed wrote ``fwd_kernel`` and ``bwd_kernel`` by hand and wired them into a
``torch.autograd.Function``. Here the host launcher of the seed's forward kernel
(``matvec.fwd_kernel``) is the whole operator.
"""

import torch
import triton
from torch import nn

from ..op import op
from .launch import itemsize
from .matvec import BS, fwd_kernel

KERNELS = (fwd_kernel,)


@op("tritongrad_examples::linear")
def linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``w @ x`` for a matrix ``w`` (m, n) and a vector ``x`` (n)."""
    w, x = w.contiguous(), x.contiguous()
    m, n = w.shape
    out = torch.empty(m, device=w.device, dtype=w.dtype)
    fwd_kernel[(triton.cdiv(m, BS),)](w, x, out, m, n, bs=BS, bn=triton.next_power_of_2(n))
    return out


class CustomLinear(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.weights = nn.Parameter(torch.randn(cout, cin) / cin**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.weights, x)


def reference(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return w @ x


def make_inputs(size=(37, 23), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    cout, cin = size
    return torch.randn(cout, cin, device=device, dtype=dtype), torch.randn(cin, device=device, dtype=dtype)


SIZES = ((37, 23), (20, 50))
BENCH_SIZES = ()
DTYPES = (torch.float64, torch.float32)


def traffic(size, dtype) -> dict[str, int]:
    m, n = size
    item = itemsize(dtype)
    return {"fwd": (m * n + n + m) * item, "bwd": (2 * m * n + 2 * n + m) * item}
