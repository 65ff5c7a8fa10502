"""LayerNorm over the last axis with a weight and a bias: ``y = (x - mean) / sqrt(var + eps) * w + b``.
One program per row, the whole row in one block, in float32 (``COMPUTE``: float64 for float64 inputs); each
row's mean and reciprocal standard deviation stored too, as the Triton tutorial's kernel stores them (an op's
backward reads them back instead of computing them again: stored_outputs.py)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel, row_block, row_warps


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, stride, N, eps, BLOCK: tl.constexpr,
                     COMPUTE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)  # the padding lanes must not add to the variance
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    y = xc * rstd * w + b
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def layernorm_launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> Launch:
    assert x.is_contiguous() and x.dim() == 2 and w.shape == b.shape == (x.shape[1],)
    y = torch.empty_like(x)
    rows, n = x.shape
    stats = torch.float64 if x.dtype == torch.float64 else torch.float32  # in the type it computes in
    mean, rstd = (torch.empty(rows, device=x.device, dtype=stats) for _ in range(2))
    meta = {"BLOCK": row_block(n), "COMPUTE": compute_type(x.dtype)}
    meta["num_warps"] = row_warps(meta["BLOCK"])
    return Launch(layernorm_kernel, (rows,), (x, w, b, y, mean, rstd, x.stride(0), n, eps), meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::layernorm")
def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return layernorm_launch(x.contiguous(), w, b, eps)()


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)


def make_inputs(size=(7, 45), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    rows, n = size
    x = 2 * torch.randn(rows, n, device=device, dtype=dtype) + 0.5
    return x, torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)


SIZES = ((7, 45), (5, 200))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    x, w = numel(size) * itemsize(dtype), size[1] * itemsize(dtype)
    return {"fwd": 2 * x + 2 * w, "bwd": 3 * x + 4 * w}  # x, w, b, dy read; dx, dw, db written
