"""Transpose with a per-row scale: ``y[j, i] = x[i, j] * s[j]`` (x is M x N, y is N x M), with ``tl.trans``."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, itemsize, numel

BLOCK_M = 16
BLOCK_N = 8


@triton.jit
def transpose_scale_kernel(x_ptr, s_ptr, y_ptr, M, N, stride_xm, stride_ym,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
    s = tl.load(s_ptr + rn, mask=rn < N, other=0.0)
    y = tl.trans(x) * s[:, None]  # (BLOCK_N, BLOCK_M)
    tl.store(y_ptr + rn[:, None] * stride_ym + rm[None, :], y, mask=(rn[:, None] < N) & (rm[None, :] < M))


def transpose_scale_launch(x: torch.Tensor, s: torch.Tensor) -> Launch:
    M, N = x.shape
    assert x.stride(1) == 1 and s.shape == (N,)
    y = torch.empty(N, M, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    args = (x, s, y, M, N, x.stride(0), y.stride(0))
    return Launch(transpose_scale_kernel, grid, args, {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N}, "y_ptr", y)


@tritongrad.op("tritongrad_examples::transpose")
def transpose(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return transpose_scale_launch(x, s)()


def reference(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x.t() * s[:, None]


def make_inputs(size=(37, 23), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = size
    return torch.randn(m, n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)


SIZES = ((37, 23), (20, 9))
BENCH_SIZES = ()
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    x, s = numel(size) * itemsize(dtype), size[1] * itemsize(dtype)
    return {"fwd": 2 * x + s, "bwd": 3 * x + 2 * s}
