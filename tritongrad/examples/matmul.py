"""``C = A @ B`` with ``tl.dot``: one 32x32 tile of C per program, all of K in one block (no loop).

Masked, so M, N, K need not be multiples of the block (29 x 27 @ 27 x 31 runs in one program).
"""

import torch
import triton
import triton.language as tl

from .launch import Launch

BLOCK = 32


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_mask = (rm[:, None] < M) & (rk[None, :] < K)
    b_mask = (rk[:, None] < K) & (rn[None, :] < N)
    a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak, mask=a_mask, other=0.0)
    b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn, mask=b_mask, other=0.0)
    c = tl.dot(a, b)
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c, mask=c_mask)


def matmul_launch(a: torch.Tensor, b: torch.Tensor) -> Launch:
    (M, K), (K2, N) = a.shape, b.shape
    assert K == K2 and K <= BLOCK, f"K={K} must fit in one block of {BLOCK}"
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return Launch(matmul_kernel, grid, args, {"BLOCK_M": BLOCK, "BLOCK_N": BLOCK, "BLOCK_K": BLOCK}, "c_ptr", c)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return matmul_launch(a, b)()


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def make_inputs(device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    # 45 x 27 @ 27 x 37: a 2 x 2 grid of tiles, each program sharing rows of A or columns of B with another
    return torch.randn(45, 27, device=device, dtype=dtype), torch.randn(27, 37, device=device, dtype=dtype)
