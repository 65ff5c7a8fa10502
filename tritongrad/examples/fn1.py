"""Seed 002 (triton-autodiff): the tile function ``fn1`` and the kernel ``tr_forward`` that applies it.

Sizes are the seed's fixed 16 x 16: ``tl.dot(c, c)`` sums over the padded axis, so
this kernel cannot be masked down to other sizes.
"""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, itemsize


@triton.jit
def fn1(x, y):
    a = tl.exp(x)
    b = tl.log(tl.expand_dims(y, 1))
    c = a + b
    return a * b + tl.dot(c, c)


@triton.jit
def tr_forward(X, Y, Z):
    r = tl.arange(0, 16)
    r2 = tl.arange(0, 16)
    x = tl.load(X + r)
    y = tl.load(Y + r2)
    z = fn1(x, y)
    tl.store(Z + 16 * r2[:, None] + r, z)


def tr_forward_launch(x: torch.Tensor, y: torch.Tensor) -> Launch:
    assert x.shape == (16,) and y.shape == (16,)
    z = torch.empty(16, 16, device=x.device, dtype=x.dtype)
    return Launch(tr_forward, (1,), (x, y, z), {}, "Z", z)


def fn1_triton(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed's host function, as a plain function."""
    return tr_forward_launch(x, y)()


@tritongrad.op("tritongrad_examples::fn1")
def fn1_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return tr_forward_launch(x.contiguous(), y.contiguous())()


OP = fn1_op  # the example's operator (`fn1` is the seed's tile function)


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed's ``torch_check``."""
    a = x.exp()
    b = y[:, None].log()
    c = a + b
    return a * b + c @ c


def make_inputs(size=16, device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, device=device, dtype=dtype)
    y = torch.rand(size, device=device, dtype=dtype) + 0.5  # log(y) needs y > 0
    return x, y


SIZES = (16,)  # the seed's kernel is fixed at 16 x 16
BENCH_SIZES = ()
DTYPES = (torch.float64, torch.float32)  # tl.exp and tl.log take float32 and float64


def traffic(size, dtype) -> dict[str, int]:
    vectors, z = 2 * size * itemsize(dtype), size * size * itemsize(dtype)
    return {"fwd": vectors + z, "bwd": vectors + z + vectors}
