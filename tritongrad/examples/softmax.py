"""Row softmax, as in the Triton tutorial: one program per row, padding loaded as -inf; computed in
float32 (``COMPUTE``: float64 for float64 inputs)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel, row_block, row_warps


@triton.jit
def softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr, COMPUTE: tl.constexpr = tl.float32):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(COMPUTE)
    z = x - tl.max(x, axis=0)
    numerator = tl.exp(z)
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def softmax_launch(x: torch.Tensor) -> Launch:
    assert x.is_contiguous() and x.dim() == 2
    y = torch.empty_like(x)
    rows, n_cols = x.shape
    args = (x, y, x.stride(0), n_cols)
    meta = {"BLOCK": row_block(n_cols), "COMPUTE": compute_type(x.dtype)}
    meta["num_warps"] = row_warps(meta["BLOCK"])
    return Launch(softmax_kernel, (rows,), args, meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::softmax")
def softmax(x: torch.Tensor) -> torch.Tensor:
    return softmax_launch(x.contiguous())()


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def make_inputs(size=(6, 37), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor]:
    return (torch.randn(size, device=device, dtype=dtype),)


SIZES = ((6, 37), (4, 300))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    x = numel(size) * itemsize(dtype)
    return {"fwd": 2 * x, "bwd": 3 * x}  # x read, y written; x (or y) and dy read, dx written
