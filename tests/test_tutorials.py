"""Kernels as people copy them from Triton's tutorials (issue 38), written here in the tutorials' style: each
wrapped with `tritongrad.op` around launch code as the tutorial writes it, checked against PyTorch autograd in
float64 with sizes that are not multiples of the blocks, output buffers poisoned."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad

D = torch.float64


@triton.jit
def row_major_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # one program per output tile, tiles numbered along the rows; ragged tiles wrap around (% M, % N) for the
    # loads and are masked off at the store
    pid = tl.program_id(axis=0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=ks[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :]
    tl.store(c_ptrs, acc, mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


@tritongrad.op
def matmul(a, b):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    row_major_matmul[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                           c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return c


@pytest.mark.parametrize("m, k, n", [(40, 30, 37), (33, 20, 48), (16, 5, 3)])
def test_a_row_major_matmul_with_ragged_tiles_gets_pytorchs_gradients(m, k, n, poisoned_empty):
    """N not a multiple of the block: the store's mask keeps the last tile's lanes past N from reaching the next
    row (issue 38: refused at launch before, as if masked-off lanes reached an element)."""
    a = torch.randn(m, k, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(k, n, dtype=D, device=DEVICE, requires_grad=True)
    c = matmul(a, b)
    torch.testing.assert_close(c, a.detach() @ b.detach())
    g = torch.randn_like(c)
    got = torch.autograd.grad(c, (a, b), g)
    want = torch.autograd.grad(a @ b, (a, b), g)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y)
