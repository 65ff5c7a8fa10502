"""A kernel updating x in place, whose PLAIN specialization stores over x without reading it."""

import torch
import triton
import triton.language as tl

import tritongrad

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
