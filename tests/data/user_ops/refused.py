"""An op whose kernel cannot be differentiated (tl.atomic_max): refused at its call when its input requires grad."""

import torch
import triton
from softplus_kernels import atomic_max_kernel

import tritongrad


@tritongrad.op
def my_max(x: torch.Tensor) -> torch.Tensor:
    y = torch.full((1,), float("-inf"), dtype=x.dtype, device=x.device)
    atomic_max_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y


def reference(x: torch.Tensor) -> torch.Tensor:
    return x.max().reshape(1)


def make_inputs(size, device="cpu", dtype=torch.float32):
    return (torch.randn(size, device=device, dtype=dtype),)


SIZES = (45,)
