"""Fuzzer finding: ``tl.reduce(x, None, combine_fn, keep_dims=True)`` of a 2-D tile.

Triton's ``tl.reduce`` flattens the tile when ``axis`` is None, so with ``keep_dims=True``
the result has shape ``(1,)``, not ``(1, 1)`` as ``tl.sum(x, keep_dims=True)``'s. The
frontend turns the reduce into ``tl.sum(x, None, keep_dims=True)``, whose adjoint
``tg.sum_grad`` broadcasts the ``(1,)`` gradient to the 2-D tile with ``tl.broadcast_to``,
which needs equal ranks: the backward crashes ("Cannot broadcast, rank mismatch"). (A max or
min is right: ``tg.extremum_grad`` broadcasts by arithmetic.) Found by tests/fuzz/generate.py,
written small by hand.
"""

import torch
import triton
import triton.language as tl

from tritongrad.tools.testing import backward_launch, poison

M, K, BM, BK = 3, 5, 4, 8


@triton.jit
def _sum(a, b):
    return a + b


@triton.jit
def total(x_ptr, y_ptr, M, K, BM: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=mask, other=0.0)
    s = tl.reduce(x, None, _sum, keep_dims=True)
    tl.store(y_ptr + tl.arange(0, 1), tl.reshape(s, (1,)))  # (s: (1,) interpreted, (1, 1) compiled)


def test_reduce_all_keep_dims():
    kernel, reference = total, torch.sum
    x = torch.randn(M, K, dtype=torch.float64)
    y = poison(torch.empty(1, dtype=torch.float64))
    kernel[(1,)](x, y, M, K, BM=BM, BK=BK)
    xs = x.clone().requires_grad_()
    want = reference(xs).reshape(1)
    torch.testing.assert_close(y, want.detach(), rtol=1e-9, atol=1e-9)
    dy = torch.randn(1, dtype=torch.float64)
    got = backward_launch(kernel, (1,), (x, y, M, K), {"BM": BM, "BK": BK}, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], torch.autograd.grad(want, xs, dy)[0], rtol=1e-9, atol=1e-9)
