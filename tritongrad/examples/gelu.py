"""GELU, tanh form: ``y = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, elementwise, with
tanh written through exp (``tanh(u) = 2 * sigmoid(2u) - 1``), in float32 (``COMPUTE``)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize, numel

BLOCK = 1024
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # a global a kernel reads must be a constexpr


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(COMPUTE)
    inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    tanh = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + tanh), mask=mask)


def gelu_launch(x: torch.Tensor) -> Launch:
    assert x.is_contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    meta = {"BLOCK": BLOCK, "COMPUTE": compute_type(x.dtype)}
    return Launch(gelu_kernel, (triton.cdiv(n, BLOCK),), (x, y, n), meta, "y_ptr", y)


@tritongrad.op("tritongrad_examples::gelu")
def gelu(x: torch.Tensor) -> torch.Tensor:
    return gelu_launch(x.contiguous())()


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def make_inputs(size=(3, 700), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor]:
    return (2 * torch.randn(size, device=device, dtype=dtype),)


SIZES = ((3, 700), (5, 61))
BENCH_SIZES = ((16384, 1024), (16384, 4096), (16384, 16384))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    x = numel(size) * itemsize(dtype)
    return {"fwd": 2 * x, "bwd": 3 * x}
