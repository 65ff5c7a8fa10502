"""A bare op updating in place a view of a buffer with a history that it returns whole (`h = a * 1.0`, a kernel on
`h[:, 2:8]`, `return h`): the segment's autograd node takes the buffer too (host/planning.py), its gradient the
shadow once the launches' backwards have zeroed what they stored and added what they loaded, so the columns the
kernel did not write pass their gradient to `a` and those it overwrote pass none. Checked in float64 against
PyTorch autograd on plain PyTorch, sizes that are not powers of two, random upstream gradients."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.core.errors import OpError

DTYPE = torch.float64


@triton.jit
def rows_update_kernel(x_ptr, w_ptr, stride_row, stride_col, n, PLAIN: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row of x, its first n columns: x * x * w in place, or (PLAIN) w * (row + 1) stored over them
    by a plain tl.store, x not read."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    at = x_ptr + row * stride_row + cols * stride_col
    if PLAIN:
        tl.store(at, w * (row + 1.0), mask=mask)
    else:
        x = tl.load(at, mask=mask, other=0.0)
        tl.store(at, x * x * w, mask=mask)


@triton.jit
def fill_rows_kernel(x_ptr, w_ptr, stride_row, n, BLOCK: tl.constexpr):
    """x[row, :n] = w * (row + 1), a plain tl.store: x is never read."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    tl.store(x_ptr + row * stride_row + cols, tl.load(w_ptr + cols, mask=mask, other=0.0) * (row + 1.0), mask=mask)


VIEWS = {  # name: (the buffer's shape, the view the kernel updates)
    "columns": ((5, 11), lambda h: h[:, 2:8]),
    "rows": ((6, 7), lambda h: h[1:4]),
    "transposed": ((7, 5), lambda h: h.t()[1:4]),  # columns 1:4 of h, as rows: strides (1, 5)
    "whole": ((5, 7), lambda h: h),
}


def updated(h, w, view, n, plain):
    """The kernel on ``view(h)``'s rows, their first ``n`` columns."""
    v = view(h)
    rows_update_kernel[(v.shape[0],)](v, w, v.stride(0), v.stride(1), n, PLAIN=plain,
                                      BLOCK=triton.next_power_of_2(n))


def reference(a, w, view, n, plain):
    """The same in plain PyTorch: ``a`` with the view's first ``n`` columns replaced."""
    old = view(a)[:, :n]
    new = w[:n] * (torch.arange(old.shape[0], dtype=DTYPE, device=a.device)[:, None] + 1.0) if plain \
        else old * old * w[:n]
    out = a * 1.0
    view(out)[:, :n] = new
    return out


def check(got, want, inputs, twins):
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(want)
    for x, y in zip(torch.autograd.grad(got, inputs, g), torch.autograd.grad(want, twins, g), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


def leaves(shape, n, device):
    a = torch.randn(*shape, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(n, dtype=DTYPE, device=device, requires_grad=True)
    return [a, w], [t.detach().clone().requires_grad_() for t in (a, w)]


@pytest.mark.parametrize("plain", [False, True], ids=["update", "plain-store"])
@pytest.mark.parametrize("name", list(VIEWS))
def test_a_view_of_a_buffer_with_a_history_updated_in_place_and_returned_whole(device, name, plain, poisoned_empty):
    """The kernel updates the view (load then store at one address), or overwrites it with a plain tl.store (its
    PLAIN specialization): the buffer's other elements pass their gradient to `a`, the overwritten ones none
    (plain) or through the update's (update); w gets its gradient either way. Before, the first backward refused
    the view cases as memory read outside x, and a plain store handed the new values' gradient to the old ones."""
    shape, view = VIEWS[name]

    @tritongrad.op
    def f(a, w):
        h = a * 1.0
        updated(h, w, view, n, plain)
        return h

    n = view(torch.empty(shape)).shape[1]
    for _ in range(2):  # the second call's backward unchecked, as a first one under CUDA-graph capture is
        inputs, twins = leaves(shape, n, device)
        check(f(*inputs), reference(*twins, view, n, plain), inputs, twins)


@pytest.mark.parametrize("plain", [False, True], ids=["update", "plain-store"])
def test_a_buffer_with_a_history_written_only_partly(device, plain, poisoned_empty):
    """The whole buffer passed, its rows' first 4 of 9 columns written (the mask): the zeros the backward stores
    are per element stored, not per view, so the other 5 columns' gradient reaches `a`, and with a plain store
    the 4 written columns' does not (exactly zero there)."""
    view = VIEWS["whole"][1]

    @tritongrad.op
    def f(a, w):
        h = a * 1.0
        updated(h, w, view, 4, plain)
        return h

    inputs, twins = leaves((6, 9), 4, device)
    check(f(*inputs), reference(*twins, view, 4, plain), inputs, twins)
    if plain:
        (ga,) = torch.autograd.grad(f(*inputs), inputs[0], torch.ones(6, 9, dtype=DTYPE, device=device))
        assert (ga[:, :4] == 0).all() and (ga[:, 4:] == 1).all()


def test_the_op_called_without_grad_gives_the_forward_result(device):
    shape, view = VIEWS["columns"]

    @tritongrad.op
    def f(a, w):
        h = a * 1.0
        updated(h, w, view, 6, False)
        return h

    inputs, twins = leaves(shape, 6, device)
    with torch.no_grad():
        got = f(*inputs)
    assert got.grad_fn is None
    torch.testing.assert_close(got, reference(*twins, view, 6, False).detach(), rtol=1e-10, atol=1e-10)


def test_a_view_updated_twice_then_read_by_pytorch(device):
    """Two in-place launches on overlapping views in one segment, then a PyTorch operation on the buffer (a second
    segment's worth of history), the buffer returned whole with that."""
    @tritongrad.op
    def f(a, w):
        h = a * 1.0
        updated(h, w, lambda t: t[:, 1:6], 5, False)
        updated(h, w, lambda t: t[:, 3:8], 5, False)
        return h * 2.0

    def want(a, w):
        return 2.0 * reference(reference(a, w, lambda t: t[:, 1:6], 5, False), w, lambda t: t[:, 3:8], 5, False)

    inputs, twins = leaves((3, 10), 5, device)
    check(f(*inputs), want(*twins), inputs, twins)


def test_a_plain_store_kernel_writing_into_a_buffer_with_a_history_is_still_refused(device):
    """A kernel that only stores through a pointer (no specialization of it loads there) may not write a tensor
    with a history: refused at the call, as before (the in-place specialization above is what is accepted)."""
    @tritongrad.op
    def f(a, w):
        h = a * 1.0
        v = h[:, 2:8]
        fill_rows_kernel[(v.shape[0],)](v, w, v.stride(0), 6, BLOCK=8)
        return h

    inputs, _ = leaves((4, 10), 6, device)
    with pytest.raises(OpError, match="writes to `x_ptr`, a tensor that requires grad"):
        f(*inputs)


def test_the_derived_kernel_of_a_specialization_storing_without_loading(device):
    """x named in wrt and outputs (as an op names a pointer some specialization updates in place), the PLAIN
    specialization storing over x without reading it: the store's adjoint zeroes x's shadow there, so the old
    values get no gradient from the new ones (they got the new values' gradient before)."""
    from tritongrad.tools.testing import backward_launch

    x, w = torch.randn(3, 7, dtype=DTYPE, device=device), torch.randn(5, dtype=DTYPE, device=device)
    g = torch.randn(3, 7, dtype=DTYPE, device=device)
    named = dict(x_ptr=x.clone(), w_ptr=w, stride_row=7, stride_col=1, n=5, PLAIN=True, BLOCK=8)
    got = backward_launch(rows_update_kernel, (3,), (), named, {"x_ptr": g}, wrt=("x_ptr", "w_ptr"),
                          outputs=("x_ptr",))
    torch.testing.assert_close(got["x_ptr"], torch.cat([torch.zeros_like(g[:, :5]), g[:, 5:]], dim=1))
    rows = torch.arange(1, 4, dtype=DTYPE, device=device)[:, None]
    torch.testing.assert_close(got["w_ptr"], (g[:, :5] * rows).sum(0), rtol=1e-10, atol=1e-10)
    src = tritongrad.grad(rows_update_kernel, ("x_ptr", "w_ptr"), ("x_ptr",), constexprs=dict(PLAIN=True)).src
    assert "tl.store(d_at, 0.0, mask=mask)" in src and "updated in place, as the forward updates it" in src
