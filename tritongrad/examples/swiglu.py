"""SwiGLU's gate: ``y = silu(a) * b = a * sigmoid(a) * b``, computed in float32 as production kernels do
(``COMPUTE``: float64 for float64 inputs)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel

BLOCK = 1024


@triton.jit
def swiglu_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(COMPUTE)
    b = tl.load(b_ptr + offs, mask=mask)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + offs, y, mask=mask)


def swiglu_launch(a: torch.Tensor, b: torch.Tensor, block: int = BLOCK) -> Launch:
    assert a.is_contiguous() and b.is_contiguous() and a.shape == b.shape
    y = torch.empty_like(a)
    n = a.numel()
    meta = {"BLOCK": block, "COMPUTE": compute_type(a.dtype)}
    return Launch(swiglu_kernel, (triton.cdiv(n, block),), (a, b, y, n), meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::swiglu")
def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return swiglu_launch(a.contiguous(), b.contiguous())()


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def make_inputs(size=(5, 61), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, device=device, dtype=dtype), torch.randn(size, device=device, dtype=dtype)


SIZES = ((5, 61), (3, 700))  # 305 elements: one masked block; 2100: three blocks, the last masked
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    n = numel(size) * itemsize(dtype)
    return {"fwd": 3 * n, "bwd": 5 * n}  # a, b read, y written; a, b, dy read, da, db written
