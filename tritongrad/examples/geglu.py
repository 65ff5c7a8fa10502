"""GeGLU's gate: ``y = gelu_tanh(a) * b``, elementwise, in float32 (``COMPUTE``)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel

BLOCK = 1024
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # a global a kernel reads must be a constexpr


@triton.jit
def geglu_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask).to(COMPUTE)
    b = tl.load(b_ptr + offs, mask=mask)
    inner = SQRT_2_OVER_PI * (a + 0.044715 * a * a * a)
    gelu = 0.5 * a * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))
    tl.store(y_ptr + offs, gelu * b, mask=mask)


def geglu_launch(a: torch.Tensor, b: torch.Tensor) -> Launch:
    assert a.is_contiguous() and b.is_contiguous() and a.shape == b.shape
    y = torch.empty_like(a)
    n = a.numel()
    meta = {"BLOCK": BLOCK, "COMPUTE": compute_type(a.dtype)}
    return Launch(geglu_kernel, (triton.cdiv(n, BLOCK),), (a, b, y, n), meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::geglu")
def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return geglu_launch(a.contiguous(), b.contiguous())()


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(a, approximate="tanh") * b


def make_inputs(size=(3, 700), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, device=device, dtype=dtype), torch.randn(size, device=device, dtype=dtype)


SIZES = ((3, 700), (5, 61))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    n = numel(size) * itemsize(dtype)
    return {"fwd": 3 * n, "bwd": 5 * n}
