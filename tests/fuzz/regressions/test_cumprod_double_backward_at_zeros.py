"""Fuzzer finding (double backward, seed 4242 kernels 160 and 181): the second derivative of ``tl.cumprod`` was wrong,
silently, where a product holds two exact zeros.

The derivative of a product with respect to one factor vanishes where another factor is zero, but its derivative with
respect to that other factor does not (the product of the rest). ``tg.cumprod_grad`` divided by ``tl.where(x == 0, 1.0,
x)`` and gave a zero the products of the other factors only where it was a product's one zero (``zeros == 1``);
differentiated again, those selections held the zeros constant, so the mixed terms between two zeros were missing.
Fixed: ``tg.cumprod_grad`` divides by nothing (an exclusive product times a suffix recurrence), and a derived kernel
differentiated again does not inline it: its rule ``tg.cumprod_grad_vjp`` is its tangent (the same scans over dual
numbers) and cumprod's tangent, exact at zeros. Checked against PyTorch's cumprod double backward: the Hessian-vector
product and the derivative with respect to the incoming gradient (the double-backward trick), along either axis of a
tile, either direction, with no zero, one, two apart and two in a row per product.
"""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad

N, BLOCK = 7, 8
R, C, RB, CB = 5, 11, 8, 16


@triton.jit
def _suffix_products(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    tl.store(y_ptr + offs, tl.cumprod(x, 0, reverse=True), mask=mask)


@tritongrad.op
def suffix_products(x):
    y = torch.empty_like(x)
    _suffix_products[(1,)](x, y, x.numel(), BLOCK=BLOCK)
    return y


@triton.jit
def _tile_products(x_ptr, y_ptr, R, C, RB: tl.constexpr, CB: tl.constexpr, AXIS: tl.constexpr,
                   REVERSE: tl.constexpr):
    rows, cols = tl.arange(0, RB), tl.arange(0, CB)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=1.0)
    y = tl.cumprod(x, AXIS, reverse=REVERSE) * tl.sin(x)  # the product's own factor read again
    tl.store(y_ptr + rows[:, None] * C + cols[None, :], y, mask=mask)


@tritongrad.op
def tile_products(x, axis: int, reverse: bool):
    y = torch.empty_like(x)
    _tile_products[(1,)](x, y, x.shape[0], x.shape[1], RB=RB, CB=CB, AXIS=axis, REVERSE=reverse)
    return y


def tile_reference(x, axis, reverse):
    p = x.flip(axis).cumprod(axis).flip(axis) if reverse else x.cumprod(axis)
    return p * torch.sin(x)


def _twice(f, x0, g, v):
    x = x0.clone().requires_grad_()
    (dx,) = torch.autograd.grad(f(x), x, g, create_graph=True)
    return dx.detach(), torch.autograd.grad((dx * v).sum(), x)[0]


def test_cumprod_double_backward_at_two_zeros():
    torch.manual_seed(0)
    x = torch.randn(N, dtype=torch.float64)
    x[2] = x[5] = 0.0
    g, v = torch.randn(N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    reference = lambda t: torch.cumprod(t.flip(0), 0).flip(0)  # noqa: E731
    got_first, got = _twice(suffix_products, x, g, v)
    want_first, want = _twice(reference, x, g, v)
    torch.testing.assert_close(got_first, want_first, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_cumprod_double_backward_at_one_zero():
    torch.manual_seed(1)
    x = torch.randn(N, dtype=torch.float64)
    x[3] = 0.0
    g, v = torch.randn(N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    got = _twice(suffix_products, x, g, v)[1]
    want = _twice(lambda t: torch.cumprod(t.flip(0), 0).flip(0), x, g, v)[1]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("axis, reverse", [(0, False), (1, False), (1, True), (0, True)])
def test_cumprod_second_derivatives_along_a_tile(axis, reverse):
    """Both second derivatives, wrt x (a Hessian-vector product) and wrt the incoming gradient, lines along the scan
    with no zero, one, two apart and two in a row."""
    torch.manual_seed(2 + axis + 2 * reverse)
    x = torch.randn(R, C, dtype=torch.float64)
    x[1, 2] = x[1, 7] = 0.0  # along rows: two apart in row 1, two in a row in row 3, one in row 4
    x[3, 4] = x[3, 5] = 0.0
    x[4, 9] = 0.0
    x[0, 3] = x[2, 3] = 0.0  # along columns: columns 3 and 6 have two (y's sin(x) factor zeroes the products
    x[2, 6] = x[4, 6] = 0.0  # ending at a zero: each direction needs one with zeros before its end), column 4 one
    g, v = torch.randn(R, C, dtype=torch.float64), torch.randn(R, C, dtype=torch.float64)
    results = []
    for f in (lambda t: tile_products(t, axis, reverse), lambda t: tile_reference(t, axis, reverse)):
        xr, gr = x.clone().requires_grad_(), g.clone().requires_grad_()
        (dx,) = torch.autograd.grad(f(xr), xr, gr, create_graph=True)
        results.append((dx.detach(), *torch.autograd.grad((dx * v).sum(), (xr, gr))))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_derived_kernel_differentiated_again_calls_the_rule_of_cumprod_grad():
    first = tritongrad.grad(_suffix_products)
    assert "tg.cumprod_grad(" in first.src and "/" not in first.src.split('"""')[2], first.src
    second = tritongrad.grad(first.kernel)
    assert "tg.cumprod_grad_vjp(" in second.src, second.src


@triton.jit
def _recurrence(a1, b1, a2, b2):
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _recurrence_rows(a_ptr, b_ptr, h_ptr, T, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + t, mask=t < T, other=1.0)
    b = tl.load(b_ptr + t, mask=t < T, other=0.0)
    _, h = tl.associative_scan((a, b), 0, _recurrence)
    tl.store(h_ptr + t, h, mask=t < T)


@tritongrad.op
def recurrence(a, b):
    h = torch.empty_like(a)
    _recurrence_rows[(1,)](a, b, h, a.numel(), BLOCK=BLOCK)
    return h


def test_a_linear_recurrence_scan_differentiated_twice():
    """`tl.associative_scan` of h = a h + b (its adjoint tg.linear_scan_grad calls tg.cumprod_grad for the products
    of the a's), a zero among the a's: the first derivative with create_graph=True is right, and so is the second
    (tg.linear_scan_grad's rule, tg.linear_scan_grad_vjp; refused before)."""
    a, b = torch.randn(N, dtype=torch.float64, requires_grad=True), torch.randn(N, dtype=torch.float64)
    a.data[3] = 0.0
    (da,) = torch.autograd.grad(recurrence(a, b).sum(), a, create_graph=True)
    h, want = torch.zeros((), dtype=torch.float64), []
    for t in range(N):
        h = a[t] * h + b[t]
        want.append(h)
    (want_da,) = torch.autograd.grad(torch.stack(want).sum(), a, create_graph=True)
    torch.testing.assert_close(da, want_da, rtol=1e-12, atol=1e-12)
    v = torch.randn(N, dtype=torch.float64)
    (got,), (want,) = (torch.autograd.grad((d * v).sum(), a) for d in (da, want_da))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
