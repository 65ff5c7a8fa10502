"""A user's module as `tritongrad check` and `bench` take it: an op, its reference, an input maker, sizes and the
bytes a pass moves. It imports its kernels from a sibling module (no PYTHONPATH needed)."""

import torch
import triton
from softplus_kernels import softplus_kernel

import tritongrad


@tritongrad.op
def my_softplus(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    softplus_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x)


def make_inputs(size, device="cpu", dtype=torch.float32):
    return (torch.randn(size, device=device, dtype=dtype),)


SIZES = (45, 130)
BENCH_SIZES = (2**20,)


def traffic(size, dtype) -> dict[str, int]:
    item = torch.empty((), dtype=dtype).element_size()
    return {"fwd": 2 * size * item, "bwd": 3 * size * item}
