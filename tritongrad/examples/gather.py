"""Gather and scale: ``y[i] = x[idx[i]] * w[i]``. Indices repeat, so gradients into x must add up."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, itemsize

BLOCK = 32


@triton.jit
def gather_kernel(x_ptr, idx_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    x = tl.load(x_ptr + idx, mask=mask, other=0.0)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = x * w
    tl.store(y_ptr + offs, y, mask=mask)


def gather_launch(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> Launch:
    assert x.is_contiguous() and idx.is_contiguous() and w.shape == idx.shape
    y = torch.empty_like(w)
    n = idx.numel()
    return Launch(gather_kernel, (triton.cdiv(n, BLOCK),), (x, idx, w, y, n), {"BLOCK": BLOCK}, "y_ptr", y)


@tritongrad.op("tritongrad_examples::gather")
def gather(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return gather_launch(x.contiguous(), idx.contiguous(), w)()


def reference(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x[idx] * w


def make_inputs(size=(19, 100), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``size`` is (values, draws): draws from fewer values repeat."""
    values, draws = size
    x = torch.randn(values, device=device, dtype=dtype)
    idx = torch.randint(0, values, (draws,), device=device)
    w = torch.randn(draws, device=device, dtype=dtype)
    return x, idx, w


SIZES = ((19, 100), (50, 77))
BENCH_SIZES = ()
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    values, draws = size
    item = itemsize(dtype)
    return {"fwd": values * item + draws * (8 + 2 * item), "bwd": values * item + draws * (8 + 3 * item)}
