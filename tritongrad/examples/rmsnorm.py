"""RMSNorm over the last axis: ``y = x / sqrt(mean(x**2) + eps) * w``. One program per row, the whole
row in one block; computed in float32 (``COMPUTE``: float64 for float64 inputs), as production kernels do,
each row's rstd stored as they store it (an op's backward reads it back: stored_outputs.py)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel, row_block, row_warps


@triton.jit
def rmsnorm_fwd(x_ptr, w_ptr, y_ptr, rstd_ptr, stride, N, eps, BLOCK: tl.constexpr,
                COMPUTE: tl.constexpr = tl.float32):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)  # the same weights in every program
    mean_square = tl.sum(x * x, axis=0) / N
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    tl.store(rstd_ptr + row, rstd)
    y = x * rstd * w
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def rmsnorm_launch(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> Launch:
    assert x.is_contiguous() and x.dim() == 2 and w.shape == (x.shape[1],)
    y = torch.empty_like(x)
    rows, n = x.shape
    rstd = torch.empty(rows, device=x.device, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    args = (x, w, y, rstd, x.stride(0), n, eps)
    meta = {"BLOCK": row_block(n), "COMPUTE": compute_type(x.dtype)}
    meta["num_warps"] = row_warps(meta["BLOCK"])
    return Launch(rmsnorm_fwd, (rows,), args, meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::rmsnorm")
def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return rmsnorm_launch(x.contiguous(), w, eps)()


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def make_inputs(size=(7, 45), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = size
    return torch.randn(rows, n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)


SIZES = ((7, 45), (5, 200))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    rows, n = size
    x, w = numel(size) * itemsize(dtype), n * itemsize(dtype)
    return {"fwd": 2 * x + w, "bwd": 3 * x + 2 * w}  # x, w read, y written; x, w, dy read, dx, dw written
