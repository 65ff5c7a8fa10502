"""SwiGLU's gate: ``y = silu(a) * b = a * sigmoid(a) * b``."""

import torch
import triton
import triton.language as tl

from .launch import Launch

BLOCK = 128


@triton.jit
def swiglu_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + offs, y, mask=mask)


def swiglu_launch(a: torch.Tensor, b: torch.Tensor) -> Launch:
    assert a.is_contiguous() and b.is_contiguous() and a.shape == b.shape
    y = torch.empty_like(a)
    n = a.numel()
    return Launch(swiglu_kernel, (triton.cdiv(n, BLOCK),), (a, b, y, n), {"BLOCK": BLOCK}, "y_ptr", y)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return swiglu_launch(a, b)()


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def make_inputs(device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(5, 61, device=device, dtype=dtype), torch.randn(5, 61, device=device, dtype=dtype)
