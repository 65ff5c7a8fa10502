"""A user's op whose reference disagrees with it (the kernel computes sin, the reference cos):
`tritongrad check` must fail on it. Also an op without a reference beside it, for the error."""

import torch
import triton
import triton.language as tl

import tritongrad


@triton.jit
def sin_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@tritongrad.op
def my_sin(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    sin_kernel[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), BLOCK=32)
    return y


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x)


def make_inputs(size, device="cpu", dtype=torch.float32):
    return (torch.randn(size, device=device, dtype=dtype),)


SIZES = (45,)
