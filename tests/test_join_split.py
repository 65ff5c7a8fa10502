"""tl.join and tl.split (an operation with two results, unpacked); tl.cat, whose element order is unspecified,
is refused."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


@triton.jit
def join_split(x_ptr, y_ptr, s_ptr, z_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr)
    pairs = tl.join(x * y, s)  # s broadcast to x's shape: its gradient is summed back
    lo, hi = tl.split(tl.exp(pairs))
    tl.store(z_ptr + offs, lo * tl.sin(hi) + x, mask=mask)


def test_join_then_split():
    n, block = 37, 16
    x, y, s = torch.randn(n, dtype=DTYPE), torch.randn(n, dtype=DTYPE), torch.randn(1, dtype=DTYPE)
    z = poison(torch.empty_like(x))
    grid = (triton.cdiv(n, block),)
    join_split[grid](x, y, s, z, n, BLOCK=block)
    leaves = [t.clone().requires_grad_() for t in (x, y, s)]
    want = torch.exp(leaves[0] * leaves[1]) * torch.sin(torch.exp(leaves[2])) + leaves[0]
    torch.testing.assert_close(z, want.detach(), **TOL)
    dz = torch.randn_like(z)
    got = backward_launch(join_split, grid, (x, y, s, z, n), {"BLOCK": block}, {"z_ptr": dz})
    for name, w in zip(("x_ptr", "y_ptr", "s_ptr"), torch.autograd.grad(want, leaves, dz), strict=True):
        torch.testing.assert_close(got[name], w, **TOL, msg=lambda m, p=name: f"d_{p}: {m}")
    src = tritongrad.grad(join_split).src
    assert "lo = halves[0]" in src and "tl.join(d_lo, d_hi)" in src, src


@triton.jit
def split_one_half(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    pairs = tl.load(x_ptr + offs[:, None] * 2 + tl.arange(0, 2)[None, :])
    re, im = tl.split(pairs)  # only `re` reaches the output: `im`'s adjoint is zero
    tl.store(y_ptr + offs, re * re)


def test_split_with_one_result_unused():
    x = torch.randn(16, 2, dtype=DTYPE)
    y = poison(torch.empty(16, dtype=DTYPE))
    split_one_half[(1,)](x, y, BLOCK=16)
    dy = torch.randn_like(y)
    got = backward_launch(split_one_half, (1,), (x, y), {"BLOCK": 16}, {"y_ptr": dy})["x_ptr"]
    torch.testing.assert_close(got, torch.stack([2 * x[:, 0] * dy, torch.zeros_like(dy)], 1), **TOL)


@triton.jit
def concatenated(x_ptr, y_ptr, z_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(z_ptr + tl.arange(0, 2 * BLOCK), tl.cat(x, y, dim=0))  # refused


def test_cat_is_refused():
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(concatenated)
    assert "`cat`, whose element order Triton leaves unspecified" in info.value.construct
    assert "tl.join" in info.value.hint and info.value.source_line.endswith("# refused")


@tritongrad.op
def _join_split_op(x, y, s):
    z = torch.empty_like(x)
    join_split[(triton.cdiv(x.numel(), 16),)](x, y, s, z, x.numel(), BLOCK=16)
    return z


@pytest.mark.slow
def test_join_then_split_differentiated_twice():
    """The derived kernel's `halves[0]` (an item of split's results; refused before: "cannot differentiate the
    subscript `halves[0]`") differentiated again: both second derivatives (the inputs', and the incoming gradient's)
    against PyTorch's double backward of the reference."""
    torch.manual_seed(3)
    inputs = [torch.randn(37, dtype=DTYPE), torch.randn(37, dtype=DTYPE), torch.randn(1, dtype=DTYPE)]

    def second_derivatives(fn):
        xs = [t.clone().requires_grad_() for t in inputs]
        torch.manual_seed(4)
        z = fn(*xs)
        gz = torch.randn_like(z).requires_grad_()
        grads = torch.autograd.grad(z, xs, gz, create_graph=True)
        return torch.autograd.grad(sum((g * torch.randn_like(g)).sum() for g in grads), (*xs, gz))

    want = second_derivatives(lambda x, y, s: torch.exp(x * y) * torch.sin(torch.exp(s)) + x)
    torch.testing.assert_close(second_derivatives(_join_split_op), want, **TOL)
