"""``softplus(x) = log(1 + exp(x))``, written the stable way: ``max(x, 0) + log(1 + exp(-|x|))``."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, itemsize, numel

BLOCK = 128


@triton.jit
def softplus_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
    tl.store(y_ptr + offs, y, mask=mask)


def softplus_launch(x: torch.Tensor) -> Launch:
    assert x.is_contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    return Launch(softplus_kernel, (triton.cdiv(n, BLOCK),), (x, y, n), {"BLOCK": BLOCK}, "y_ptr", y)


@tritongrad.op("tritongrad_examples::softplus")
def softplus(x: torch.Tensor) -> torch.Tensor:
    return softplus_launch(x.contiguous())()


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x)


def make_inputs(size=300, device="cpu", dtype=torch.float32) -> tuple[torch.Tensor]:
    return (4 * torch.randn(size, device=device, dtype=dtype),)  # wide enough to reach both tails


SIZES = (300, 1000)
BENCH_SIZES = (2**20, 2**22, 2**24, 2**26)
DTYPES = (torch.float64, torch.float32)  # tl.exp and tl.log take float32 and float64


def traffic(size, dtype) -> dict[str, int]:
    n = numel(size) * itemsize(dtype)
    return {"fwd": 2 * n, "bwd": 3 * n}
