"""RMSNorm over the last axis: ``y = x / sqrt(mean(x**2) + eps) * w``. One program per row."""

import torch
import triton
import triton.language as tl

from .launch import Launch


@triton.jit
def rmsnorm_fwd(x_ptr, w_ptr, y_ptr, stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)  # the same weights in every program
    mean_square = tl.sum(x * x, axis=0) / N
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    y = x * rstd * w
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def rmsnorm_launch(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> Launch:
    assert x.is_contiguous() and x.dim() == 2 and w.shape == (x.shape[1],)
    y = torch.empty_like(x)
    rows, n = x.shape
    args = (x, w, y, x.stride(0), n, eps)
    return Launch(rmsnorm_fwd, (rows,), args, {"BLOCK": triton.next_power_of_2(n)}, "y_ptr", y)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return rmsnorm_launch(x, w, eps)()


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def make_inputs(device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(7, 45, device=device, dtype=dtype)
    w = torch.randn(45, device=device, dtype=dtype)
    return x, w
