"""Masked loads: an ``other=`` that has a gradient gets the adjoints of the lanes the mask leaves out
and lanes a mask left out add exactly zero where their adjoint is zero, whatever
value they hold (no ``0 * inf = NaN``).

Each kernel is written the way production code writes it, checked in float64 against PyTorch
autograd on a plain-PyTorch reference (the unpadded function), sizes that are not powers of two,
NaN-poisoned outputs, random upstream gradients.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools.testing import assert_gradients_match, poison

DTYPE = torch.float64


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


# -- other= with a gradient ------------------------------------------------------------------------


@triton.jit
def group_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, GROUP_SIZE, HW, C_PER_G, G, eps, BLOCK: tl.constexpr):
    """One program per (sample, group) of an (N, C, H*W) input: mean, then the variance of the group
    with the masked-off lanes filled with the mean (so they add nothing), then normalize."""
    pid = tl.program_id(0)
    group = pid % G
    start = pid * GROUP_SIZE
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=x_ptr.dtype.element_ty)
    for i in range(0, GROUP_SIZE, BLOCK):
        idx = i + offs
        x = tl.load(x_ptr + start + idx, mask=idx < GROUP_SIZE, other=0.0)
        acc += x
    mean = tl.sum(acc, axis=0) / GROUP_SIZE
    acc2 = tl.zeros([BLOCK], dtype=x_ptr.dtype.element_ty)
    for i in range(0, GROUP_SIZE, BLOCK):
        idx = i + offs
        x = tl.load(x_ptr + start + idx, mask=idx < GROUP_SIZE, other=mean)
        xc = x - mean
        acc2 += xc * xc
    var = tl.sum(acc2, axis=0) / GROUP_SIZE
    rstd = 1.0 / tl.sqrt(var + eps)
    for i in range(0, GROUP_SIZE, BLOCK):
        idx = i + offs
        mask = idx < GROUP_SIZE
        x = tl.load(x_ptr + start + idx, mask=mask, other=mean)
        channel = group * C_PER_G + idx // HW
        w = tl.load(w_ptr + channel, mask=mask)
        b = tl.load(b_ptr + channel, mask=mask)
        tl.store(y_ptr + start + idx, (x - mean) * rstd * w + b, mask=mask)


def group_norm_launch(x, w, b, groups, eps=1e-5, block=32):
    n, c = x.shape[:2]
    hw = x[0, 0].numel()
    y = poison(torch.empty_like(x))
    group_size = c // groups * hw
    grid = (n * groups,)
    args = (x, w, b, y, group_size, hw, c // groups, groups, eps)
    return grid, args, {"BLOCK": block}, y


def test_group_norm_filling_masked_lanes_with_the_mean(device):
    x = torch.randn(3, 6, 5, 7, dtype=DTYPE, device=device) * 2 + 0.5  # groups of 2 * 35 = 70: 3 blocks of 32
    w, b = torch.randn(6, dtype=DTYPE, device=device), torch.randn(6, dtype=DTYPE, device=device)
    grid, args, kwargs, y = group_norm_launch(x, w, b, groups=3)
    group_norm_kernel[grid](*args, **kwargs)
    lx, lw, lb = leaves(x, w, b)
    want = F.group_norm(lx, 3, lw, lb, eps=1e-5)
    torch.testing.assert_close(y, want.detach(), rtol=1e-10, atol=1e-10)
    assert_gradients_match(group_norm_kernel, grid, args, kwargs, y, want, [lx, lw, lb], ["x_ptr", "w_ptr", "b_ptr"])


@triton.jit
def padded_row_dot(x_ptr, fill_ptr, w_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    """y[r] = sum over a block of BLOCK lanes of x[r] * w, the lanes past the row holding a learned fill."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    fill = tl.load(fill_ptr + row)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=fill)
    w = tl.load(w_ptr + cols)
    tl.store(y_ptr + row, tl.sum(x * w, axis=0))


@triton.jit
def padded_row_blend(x_ptr, z_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    """y[r, :] = exp(row of x, continued past its end by the same lanes of z)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    z = tl.load(z_ptr + row * BLOCK + cols)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=z * 2.0)
    tl.store(y_ptr + row * BLOCK + cols, tl.exp(x))


def test_masked_off_lanes_give_their_adjoints_to_a_scalar_other(device):
    rows, n, block = 5, 11, 16
    x, fill = torch.randn(rows, n, dtype=DTYPE, device=device), torch.randn(rows, dtype=DTYPE, device=device)
    w = torch.randn(block, dtype=DTYPE, device=device)
    y = poison(torch.empty(rows, dtype=DTYPE, device=device))
    args = (x, fill, w, y, n, x.stride(0))
    padded_row_dot[(rows,)](*args, BLOCK=block)
    lx, lfill, lw = leaves(x, fill, w)
    want = (torch.cat([lx, lfill[:, None].expand(rows, block - n)], 1) * lw).sum(1)
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(padded_row_dot, (rows,), args, {"BLOCK": block}, y, want, [lx, lfill, lw],
                           ["x_ptr", "fill_ptr", "w_ptr"])


def test_masked_off_lanes_give_their_adjoints_to_a_tile_other(device):
    rows, n, block = 4, 9, 16
    x, z = torch.randn(rows, n, dtype=DTYPE, device=device), torch.randn(rows, block, dtype=DTYPE, device=device)
    y = poison(torch.empty(rows, block, dtype=DTYPE, device=device))
    args = (x, z, y, n, x.stride(0))
    padded_row_blend[(rows,)](*args, BLOCK=block)
    lx, lz = leaves(x, z)
    want = torch.exp(torch.cat([lx, lz[:, n:] * 2.0], 1))
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(padded_row_blend, (rows,), args, {"BLOCK": block}, y, want, [lx, lz], ["x_ptr", "z_ptr"])


def test_the_adjoint_of_other_is_shown_under_its_load():
    src = tritongrad.grad(padded_row_dot).src
    # the text is the point (where the adjoint is shown): test_masked_off_lanes_give_their_adjoints_to_a_scalar_other
    # checks this kernel's gradients
    assert "d_fill = tg.unbroadcast(tl.where(cols < n_cols, 0.0, d_x), fill)" in src, src


# -- lanes a mask left out add exactly zero (no 0 * inf) ----------------------------------------------------


@triton.jit
def log_softmax_with_temperature(x_ptr, t_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    """y = log_softmax(x * t) per row, t a learned temperature; the padding lanes hold -inf."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    t = tl.load(t_ptr)
    z = x * t
    z = z - tl.max(z, axis=0)
    y = z - tl.log(tl.sum(tl.exp(z), axis=0))
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


@triton.jit
def scaled_ratio(x_ptr, d_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = s * x / d elementwise, s a learned scalar; the padding lanes divide 0 by 0."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    d = tl.load(d_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr)
    tl.store(y_ptr + offs, s * (x / d), mask=mask)


def test_padding_with_minus_inf_gives_a_finite_temperature_gradient(device):
    rows, n, block = 6, 13, 16
    x, t = torch.randn(rows, n, dtype=DTYPE, device=device), torch.rand(1, dtype=DTYPE, device=device) + 0.5
    y = poison(torch.empty(rows, n, dtype=DTYPE, device=device))
    args = (x, t, y, n, x.stride(0))
    log_softmax_with_temperature[(rows,)](*args, BLOCK=block)
    lx, lt = leaves(x, t)
    want = torch.log_softmax(lx * lt, dim=-1)  # the unpadded function
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(log_softmax_with_temperature, (rows,), args, {"BLOCK": block}, y, want, [lx, lt],
                           ["x_ptr", "t_ptr"])


def test_a_division_by_padding_zeros_gives_a_finite_scale_gradient(device):
    n, block = 37, 16
    x = torch.randn(n, dtype=DTYPE, device=device)
    d = torch.rand(n, dtype=DTYPE, device=device) + 0.5
    s = torch.randn(1, dtype=DTYPE, device=device)
    y = poison(torch.empty(n, dtype=DTYPE, device=device))
    args = (x, d, s, y, n)
    grid = (triton.cdiv(n, block),)
    scaled_ratio[grid](*args, BLOCK=block)
    lx, ld, ls = leaves(x, d, s)
    want = ls * (lx / ld)
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(scaled_ratio, grid, args, {"BLOCK": block}, y, want, [lx, ld, ls],
                           ["x_ptr", "d_ptr", "s_ptr"])


def test_only_products_with_padding_that_may_be_infinite_are_guarded():
    src = tritongrad.grad(log_softmax_with_temperature).src
    # the text is the point (which products are guarded): the gradients are checked by
    # test_padding_with_minus_inf_gives_a_finite_temperature_gradient, and the examples' by test_kernels.py's
    # test_check_passes
    assert "tg.unbroadcast(tl.where(d_z == 0.0, 0.0, d_z * x), t)" in src, src
    assert src.count("== 0.0") == 1, src  # exp(-inf) is 0: the softmax's own adjoints need no guard
    from tritongrad.examples import rmsnorm, softmax

    for kernel in (softmax.softmax_kernel, rmsnorm.rmsnorm_fwd):  # padding with 0.0, divisions by row sums
        assert "== 0.0" not in tritongrad.grad(kernel).src
