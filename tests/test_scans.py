"""Scans as kernels: tl.cumsum, tl.cumprod(reverse=True), and tl.associative_scan of a first-order
linear recurrence. Float64, rows not multiples of the block, several programs, NaN-poisoned
outputs, random upstream gradients."""

import torch
import triton
import triton.language as tl

from tritongrad.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


def check(kernel, grid, args, meta, out, want, leaves, names):
    torch.testing.assert_close(out, want.detach(), **TOL)
    d_out = torch.randn_like(out)
    output = next(p for p, a in zip(kernel.arg_names, args, strict=False) if a is out)
    got = backward_launch(kernel, grid, args, meta, {output: d_out})
    wanted = torch.autograd.grad(want, leaves, d_out)
    for name, w in zip(names, wanted, strict=True):
        torch.testing.assert_close(got[name], w, **TOL, msg=lambda m, n=name: f"d_{n}: {m}")


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
