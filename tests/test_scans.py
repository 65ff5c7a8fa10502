"""Scans as kernels: tl.cumsum, tl.cumprod(reverse=True), and tl.associative_scan of a first-order
linear recurrence. Float64, rows not multiples of the block, several programs, NaN-poisoned
outputs, random upstream gradients."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import assert_gradients_match, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


def check(kernel, grid, args, meta, out, want, leaves, names):
    torch.testing.assert_close(out, want.detach(), **TOL)
    assert_gradients_match(kernel, grid, args, meta, out, want, leaves, names)


@triton.jit
def cumsum_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + row * stride + cols, tl.cumsum(x * x, axis=0), mask=cols < N)


def test_cumsum_kernel():
    rows, n = 5, 37
    x = torch.randn(rows, n, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    args = (x, y, n, x.stride(0))
    cumsum_rows[(rows,)](*args, BLOCK=64)
    leaf = x.clone().requires_grad_()
    check(cumsum_rows, (rows,), args, {"BLOCK": 64}, y, torch.cumsum(leaf * leaf, 1), [leaf], ("x_ptr",))


@triton.jit
def reverse_cumprod_rows(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=1.0)  # padding multiplies by one
    tl.store(y_ptr + row * stride + cols, tl.cumprod(x, 0, reverse=True), mask=cols < N)


def test_reverse_cumprod_kernel_with_zeros():
    rows, n = 4, 21
    x = torch.rand(rows, n, dtype=DTYPE) + 0.5
    x[1, 7] = 0.0  # one zero
    x[2, 3] = x[2, 12] = 0.0  # two
    x[3, 0] = 0.0  # at the end of the reverse scan
    y = poison(torch.empty_like(x))
    args = (x, y, n, x.stride(0))
    reverse_cumprod_rows[(rows,)](*args, BLOCK=32)
    leaf = x.clone().requires_grad_()
    want = leaf.flip(1).cumprod(1).flip(1)
    check(reverse_cumprod_rows, (rows,), args, {"BLOCK": 32}, y, want, [leaf], ("x_ptr",))


# -- tl.associative_scan of h_t = a_t h_{t-1} + b_t: its adjoint is a scan the other way --------------


@triton.jit
def _recurrence(a1, b1, a2, b2):
    return a1 * a2, b1 * a2 + b2


@triton.jit
def scan_recurrence(a_ptr, b_ptr, h_ptr, T, stride, BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    row = tl.program_id(0)
    t = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + row * stride + t, mask=t < T, other=1.0)
    b = tl.load(b_ptr + row * stride + t, mask=t < T, other=0.0)
    _, h = tl.associative_scan((a, b), 0, _recurrence, reverse=REVERSE)
    tl.store(h_ptr + row * stride + t, h, mask=t < T)


def recurrence_reference(a, b, reverse=False):
    steps = range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])
    h, out = torch.zeros_like(a[:, 0]), {}
    for t in steps:
        h = a[:, t] * h + b[:, t]
        out[t] = h
    return torch.stack([out[t] for t in range(a.shape[1])], 1)


@pytest.mark.parametrize("reverse", [False, True])
def test_linear_recurrence_scan(reverse):
    rows, steps = 3, 27
    a, b = torch.randn(rows, steps, dtype=DTYPE), torch.randn(rows, steps, dtype=DTYPE)
    a[0, 5] = a[1, 20] = 0.0  # a zero coefficient cuts the dependence on the past: no division by a
    h = poison(torch.empty_like(a))
    args = (a, b, h, steps, a.stride(0))
    meta = {"BLOCK": 32, "REVERSE": reverse}
    scan_recurrence[(rows,)](*args, **meta)
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    check(scan_recurrence, (rows,), args, meta, h, recurrence_reference(*leaves, reverse), leaves,
          ("a_ptr", "b_ptr"))
    src = tritongrad.grad(scan_recurrence).src
    assert "scan = tl.associative_scan((a, b), 0, _recurrence, reverse=REVERSE)" in src, src
    assert "tg.linear_scan_grad(" in src


@triton.jit
def scan_products_and_state(a_ptr, b_ptr, y_ptr, T, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + t, mask=t < T, other=1.0)
    b = tl.load(b_ptr + t, mask=t < T, other=0.0)
    prods, h = tl.associative_scan((a, b), axis=0, combine_fn=_recurrence)
    tl.store(y_ptr + t, prods * tl.sin(h), mask=t < T)


def test_linear_recurrence_scan_uses_both_results():
    steps = 13
    a, b = torch.rand(steps, dtype=DTYPE) + 0.5, torch.randn(steps, dtype=DTYPE)
    y = poison(torch.empty_like(a))
    scan_products_and_state[(1,)](a, b, y, steps, BLOCK=16)
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    want = torch.cumprod(leaves[0], 0) * torch.sin(recurrence_reference(leaves[0][None], leaves[1][None])[0])
    check(scan_products_and_state, (1,), (a, b, y, steps), {"BLOCK": 16}, y, want, leaves, ("a_ptr", "b_ptr"))


@triton.jit
def _affine_the_other_way(a1, b1, a2, b2):
    return a1 * a2, b1 + a1 * b2  # h = h + a * b...: not the recurrence


@triton.jit
def scan_other_combine(a_ptr, b_ptr, h_ptr, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + t)
    b = tl.load(b_ptr + t)
    _, h = tl.associative_scan((a, b), 0, _affine_the_other_way)  # refused
    tl.store(h_ptr + t, h)


def test_other_combine_functions_are_refused():
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(scan_other_combine)
    assert "`tl.associative_scan` combining with `_affine_the_other_way`" in info.value.construct
    assert info.value.source_line.endswith("# refused")
    assert info.value.line > 0 and info.value.file.endswith("test_scans.py")


@triton.jit
def _add(x, y):
    return x + y


@triton.jit
def scan_sum(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, tl.exp(tl.associative_scan(x, 0, _add, reverse=True)), mask=offs < N)


def test_associative_scan_of_a_sum_is_a_cumsum():
    n = 19
    x = torch.randn(n, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    scan_sum[(1,)](x, y, n, BLOCK=32)
    leaf = x.clone().requires_grad_()
    check(scan_sum, (1,), (x, y, n), {"BLOCK": 32}, y, torch.exp(leaf.flip(0).cumsum(0).flip(0)), [leaf], ("x_ptr",))


@triton.jit
def scan_sum_by_keywords(x_ptr, y_ptr, R, C, BR: tl.constexpr, BC: tl.constexpr):
    r, c = tl.arange(0, BR), tl.arange(0, BC)
    mask = (r < R)[:, None] & (c < C)[None, :]
    x = tl.load(x_ptr + r[:, None] * C + c[None, :], mask=mask, other=0.0)
    y = tl.associative_scan(x * x, axis=1, combine_fn=_add, reverse=True)
    tl.store(y_ptr + r[:, None] * C + c[None, :], y, mask=mask)


def test_associative_scan_of_a_sum_with_its_axis_named_is_a_cumsum():
    """The axis, combine function and direction passed by keyword, as Triton's signature allows (the fuzzer's
    spelling; refused before: 'not a sum of one tensor', the axis looked for among the positional arguments only)."""
    rows, cols = 5, 13
    x = torch.randn(rows, cols, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    args, meta = (x, y, rows, cols), {"BR": 8, "BC": 16}
    scan_sum_by_keywords[(1,)](*args, **meta)
    leaf = x.clone().requires_grad_()
    want = (leaf * leaf).flip(1).cumsum(1).flip(1)
    check(scan_sum_by_keywords, (1,), args, meta, y, want, [leaf], ("x_ptr",))


@tritongrad.op
def _recurrence_op(a, b, reverse):
    h = torch.empty_like(a)
    scan_recurrence[(a.shape[0],)](a, b, h, a.shape[1], a.stride(0), BLOCK=16, REVERSE=reverse)
    return h


@tritongrad.op
def _products_and_state_op(a, b):
    y = torch.empty_like(a)
    scan_products_and_state[(1,)](a, b, y, a.shape[0], BLOCK=16)
    return y


def _second_derivatives(fn, inputs):
    """Both second derivatives of ``fn`` along random directions: of ``<grad, v>`` for the inputs (a Hessian-vector
    product) and for the incoming gradient (the Jacobian-vector product the double-backward trick takes)."""
    torch.manual_seed(7)
    y = fn(*inputs)
    gy = torch.randn_like(y).requires_grad_()
    grads = torch.autograd.grad(y, inputs, gy, create_graph=True)
    inner = sum((g * torch.randn_like(g)).sum() for g in grads)
    return torch.autograd.grad(inner, (*inputs, gy))


@pytest.mark.slow
@pytest.mark.compiled
@pytest.mark.parametrize("case", ["forward", "reverse", "same tensor twice", "both results"])
def test_linear_recurrence_scan_differentiated_twice(case):
    """The derived kernel's `tg.linear_scan_grad` differentiated again by its rule (`tg.linear_scan_grad_vjp`: scans
    both ways, no division), its results read as `d_scan[0]`, `d_scan[1]` (refused before: "cannot differentiate
    the subscript `scan[1]`"). Against PyTorch's double backward of the loop reference, zeros in `a` included."""
    rows, steps = 2, 11
    a, b = torch.randn(rows, steps, dtype=DTYPE), torch.randn(rows, steps, dtype=DTYPE)
    a[0, 3] = a[1, 8] = 0.0
    if case == "both results":
        a, b = a[0] * 0.5 + 1.0, b[0]
        a[4] = 0.0
        fns = (_products_and_state_op, lambda a, b: torch.cumprod(a, 0) * torch.sin(
            recurrence_reference(a[None], b[None])[0]))
    elif case == "same tensor twice":
        fns = (lambda x: _recurrence_op(x, x, False), lambda x: recurrence_reference(x, x))
    else:
        reverse = case == "reverse"
        fns = (lambda a, b: _recurrence_op(a, b, reverse), lambda a, b: recurrence_reference(a, b, reverse))
    inputs = (a,) if case == "same tensor twice" else (a, b)
    got, want = (_second_derivatives(fn, [t.clone().requires_grad_() for t in inputs]) for fn in fns)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL)
