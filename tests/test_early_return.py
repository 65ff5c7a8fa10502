"""Early returns outside loops: the rest of the body runs in the branch that does not return.

Each kernel is written the way production code writes it; gradients against torch autograd
on a float64 reference, sizes that are not powers of two, NaN-poisoned outputs.
"""

import pytest
import torch
import triton
import triton.language as tl
from test_refusals import marked_line

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import assert_gradients_match, poison

IGNORE = -100


@triton.jit
def cross_entropy(logits_ptr, target_ptr, loss_ptr, stride, N, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    target = tl.load(target_ptr + row)
    if target == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        return
    cols = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    m = tl.max(x, 0)
    lse = m + tl.log(tl.sum(tl.exp(x - m), 0))
    x_target = tl.load(logits_ptr + row * stride + target)
    tl.store(loss_ptr + row, lse - x_target)


def test_cross_entropy_returns_early_on_ignored_rows():
    rows, n = 11, 37
    logits = torch.randn(rows, n, dtype=torch.float64)
    target = torch.randint(0, n, (rows,))
    target[[1, 4, 5, 9]] = IGNORE
    loss = poison(torch.empty(rows, dtype=torch.float64))
    args = (logits, target, loss, n, n, IGNORE)
    cross_entropy[(rows,)](*args, BLOCK=64)
    leaf = logits.clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(leaf, target, ignore_index=IGNORE, reduction="none")
    torch.testing.assert_close(loss, want.detach())
    assert_gradients_match(cross_entropy, (rows,), args, {"BLOCK": 64}, loss, want, [leaf], ["logits_ptr"])


@triton.jit
def _scaled_or_skipped(x, w, skip: tl.constexpr):
    if skip:
        return x
    if tl.sum(w, 0) > 0:  # a runtime condition
        return x * w
    y = x * tl.sigmoid(w)
    return y + 1.0


@triton.jit
def returns_in_a_helper(x_ptr, w_ptr, y_ptr, N, SKIP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + row * N + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * N + cols, _scaled_or_skipped(x, w, SKIP), mask=mask)


@pytest.mark.parametrize("skip", [False, True])
def test_a_helper_returning_early_on_runtime_and_constexpr_conditions(skip):
    rows, n = 6, 13
    x, w = torch.randn(rows, n, dtype=torch.float64), torch.randn(rows, n, dtype=torch.float64)
    w[::2] = w[::2].abs()  # rows with a positive sum take the first runtime return
    y = poison(torch.empty_like(x))
    args = (x, w, y, n)
    meta = {"SKIP": skip, "BLOCK": 16}
    returns_in_a_helper[(rows,)](*args, **meta)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    positive = (ws.sum(1, keepdim=True) > 0).detach()
    want = xs + 0 * ws if skip else torch.where(positive, xs * ws, xs * torch.sigmoid(ws) + 1.0)
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(returns_in_a_helper, (rows,), args, meta, y, want, [xs, ws], ["x_ptr", "w_ptr"])


@triton.jit
def nested_returns(x_ptr, flag_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    flag = tl.load(flag_ptr + row)
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    if flag > 0:
        if flag > 1:
            tl.store(y_ptr + row * N + cols, x * 3.0, mask=mask)
            return
        x = x * 2.0
    tl.store(y_ptr + row * N + cols, tl.exp(x), mask=mask)


def test_a_return_nested_in_branches_keeps_the_rest_on_the_other_paths():
    rows, n = 7, 10
    x = torch.randn(rows, n, dtype=torch.float64)
    flag = torch.tensor([0, 1, 2, 0, 2, 1, 3], dtype=torch.float64)  # (an int flag would be taken for wrt)
    y = poison(torch.empty_like(x))
    nested_returns[(rows,)](x, flag, y, n, BLOCK=16)
    xs = x.clone().requires_grad_()
    f = flag[:, None]
    want = torch.where(f > 1, xs * 3.0, torch.exp(torch.where(f > 0, xs * 2.0, xs)))
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(nested_returns, (rows,), (x, flag, y, n), {"BLOCK": 16}, y, want, [xs], ["x_ptr"])


@triton.jit
def _store_unless(ptr, value, mask, skip):
    if skip:
        return
    tl.store(ptr, value, mask=mask)


@triton.jit
def stores_through_a_helper(x_ptr, skip_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    _store_unless(y_ptr + row * N + cols, tl.sin(x), mask, tl.load(skip_ptr + row) != 0)


def test_a_helper_that_stores_returns_early_without_a_value():
    rows, n = 5, 21
    x = torch.randn(rows, n, dtype=torch.float64)
    skip = torch.tensor([0, 1, 0, 0, 1], dtype=torch.int32)
    y = torch.zeros_like(x)  # skipped rows stay as the host made them
    stores_through_a_helper[(rows,)](x, skip, y, n, BLOCK=32)
    xs = x.clone().requires_grad_()
    want = torch.where(skip[:, None] != 0, 0.0, torch.sin(xs))
    torch.testing.assert_close(y, want.detach())
    d_y = torch.randn_like(y)
    bwd = tritongrad.grad(stores_through_a_helper, wrt=("x_ptr",))
    d_x = torch.zeros_like(x)
    bwd[(rows,)](x, skip, y, n, d_y, d_x, BLOCK=32)
    torch.testing.assert_close(d_x, torch.autograd.grad(want, xs, d_y)[0])


@triton.jit
def skipped_by_a_flag(x_ptr, y_ptr, N, SKIP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if SKIP:
        return
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, tl.exp(x), mask=offs < N)


@pytest.mark.parametrize("skip", [False, True])
def test_a_constexpr_early_return_at_the_top(skip):
    """What follows the return exists only in the branch that does not return: its adjoints start there
    (a constexpr `if` would otherwise let them outlive it, and start them where `x` does not exist)."""
    n = 37
    x = torch.randn(n, dtype=torch.float64)
    y = torch.zeros_like(x)
    grid = (triton.cdiv(n, 16),)
    skipped_by_a_flag[grid](x, y, n, SKIP=skip, BLOCK=16)
    xs = x.clone().requires_grad_()
    want = xs * 0 if skip else torch.exp(xs)
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(skipped_by_a_flag, grid, (x, y, n), {"SKIP": skip, "BLOCK": 16}, y, want, [xs], ["x_ptr"])


@triton.jit
def return_in_a_loop(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(T):
        x = tl.load(x_ptr + t * BLOCK + offs)
        if tl.sum(x, 0) > 0:
            return  # refused
        acc += x
    tl.store(y_ptr + offs, acc)


@triton.jit
def return_value_in_a_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    if tl.sum(x, 0) > 0:
        return x  # refused
    tl.store(y_ptr + offs, x)


@triton.jit
def _returns_on_one_path_only(x):
    if tl.sum(x, 0) > 0:
        return x * 2.0  # refused
    x = x + 1.0


@triton.jit
def calls_a_helper_returning_on_one_path(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, _returns_on_one_path_only(tl.load(x_ptr + offs)))


@pytest.mark.parametrize("kernel, construct, helper", [
    (return_in_a_loop, "a `return` inside a `for` statement", None),
    (return_value_in_a_kernel, "a `return` with a value in a kernel", None),
    (calls_a_helper_returning_on_one_path, "a helper that returns a value on some paths only",
     _returns_on_one_path_only),
])
def test_returns_that_cannot_be_lifted_are_refused(kernel, construct, helper):
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(kernel)
    assert construct in info.value.construct, str(info.value)
    assert info.value.line == marked_line(helper or kernel)
