"""A max subtracted before exp and normalized away has no gradient (stabilizers.py): softmax, log-softmax
and log-sum-exp are differentiated without it, and gradients still match autograd; a max whose value does
reach an output keeps its gradient."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools.testing import assert_gradients_match, poison

ROWS, N, BLOCK = 6, 45, 64


@triton.jit
def softmax_rows(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


@triton.jit
def log_softmax_rows(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    m = tl.max(x, axis=0)
    lse = m + tl.log(tl.sum(tl.exp(x - m), axis=0))
    tl.store(y_ptr + row * n + cols, x - lse, mask=cols < n)


@triton.jit
def logsumexp2_rows(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf")) * 1.4426950408889634
    m = tl.max(x, axis=0)
    lse2 = m + tl.log2(tl.sum(tl.exp2(x - m), axis=0))
    tl.store(y_ptr + row, lse2 * 0.6931471805599453)


@triton.jit
def shifted_rows(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    tl.store(y_ptr + row * n + cols, tl.exp(x - tl.max(x, axis=0)), mask=cols < n)  # not normalized


CASES = [
    (softmax_rows, lambda x: torch.softmax(x, 1), True, (ROWS, N)),
    (log_softmax_rows, lambda x: torch.log_softmax(x, 1), True, (ROWS, N)),
    (logsumexp2_rows, lambda x: torch.logsumexp(x, 1), True, (ROWS,)),
    (shifted_rows, lambda x: torch.exp(x - x.amax(1, keepdim=True)), False, (ROWS, N)),
]


@pytest.mark.parametrize("kernel, reference, stabilized, out_shape", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_a_stabilizing_max_has_no_gradient_and_the_rest_is_exact(kernel, reference, stabilized, out_shape):
    x = 3 * torch.randn(ROWS, N, dtype=torch.float64)
    x[2, 7] = x[2, 30] = x[2].max() + 1  # a tie at the max
    y = poison(torch.empty(out_shape, dtype=torch.float64))
    kernel[(ROWS,)](x, y, N, BLOCK=BLOCK)
    leaf = x.clone().requires_grad_()
    want = reference(leaf)
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(kernel, (ROWS,), (x, y, N), {"BLOCK": BLOCK}, y, want, [leaf], ["x_ptr"])
    src = tritongrad.grad(kernel).src
    assert ("extremum_grad" not in src) == stabilized, src
    assert ("its gradient is zero (stabilizers.py)" in src) == stabilized
