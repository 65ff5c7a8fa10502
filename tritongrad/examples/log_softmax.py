"""Row log-softmax: ``y = x - max(x) - log(sum(exp(x - max(x))))``; one program per row, padding
loaded as -inf; in float32 (``COMPUTE``: float64 for float64 inputs)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel, row_block, row_warps


@triton.jit
def log_softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(COMPUTE)
    z = x - tl.max(x, axis=0)
    y = z - tl.log(tl.sum(tl.exp(z), axis=0))
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def log_softmax_launch(x: torch.Tensor) -> Launch:
    assert x.is_contiguous() and x.dim() == 2
    y = torch.empty_like(x)
    rows, n = x.shape
    meta = {"BLOCK": row_block(n), "COMPUTE": compute_type(x.dtype)}
    meta["num_warps"] = row_warps(meta["BLOCK"])
    return Launch(log_softmax_kernel, (rows,), (x, y, x.stride(0), n), meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::log_softmax")
def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return log_softmax_launch(x.contiguous())()


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1)


def make_inputs(size=(6, 37), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor]:
    return (3 * torch.randn(size, device=device, dtype=dtype),)


SIZES = ((6, 37), (4, 300))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    x = numel(size) * itemsize(dtype)
    return {"fwd": 2 * x, "bwd": 3 * x}
