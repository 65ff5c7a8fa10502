"""Fused residual add and RMSNorm, two outputs: ``h = x + r`` (the new residual stream) and
``y = h / sqrt(mean(h**2) + eps) * w``. One program per row, in float32 (``COMPUTE``)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import compute_type, itemsize, numel, row_block, row_warps


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, stride, N, eps, BLOCK: tl.constexpr,
                       COMPUTE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(COMPUTE)
    r = tl.load(r_ptr + row * stride + cols, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    h = x + r
    tl.store(h_ptr + row * stride + cols, h, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / N + eps)
    tl.store(y_ptr + row * stride + cols, h * rstd * w, mask=mask)


@tritongrad.op("tritongrad_examples::add_rmsnorm")
def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    x, r = x.contiguous(), r.contiguous()
    assert x.dim() == 2 and r.shape == x.shape and w.shape == (x.shape[1],)
    y, h = torch.empty_like(x), torch.empty_like(x)
    rows, n = x.shape
    block = row_block(n)
    add_rmsnorm_kernel[(rows,)](x, r, w, y, h, x.stride(0), n, eps, BLOCK=block, COMPUTE=compute_type(x.dtype),
                                num_warps=row_warps(block))
    return y, h


def reference(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    h = x + r
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w, h


def make_inputs(size=(7, 45), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    rows, n = size
    x, r = (torch.randn(rows, n, device=device, dtype=dtype) for _ in range(2))
    return x, r, torch.randn(n, device=device, dtype=dtype)


SIZES = ((7, 45), (5, 200))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    x, w = numel(size) * itemsize(dtype), size[1] * itemsize(dtype)
    return {"fwd": 4 * x + w, "bwd": 4 * x + 2 * w}  # x, r, w read, y, h written; x, r (or h), dy, dh read...
