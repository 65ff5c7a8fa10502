"""Grid-stride loops over elements: ``for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK)``,
the common persistent spelling of an elementwise kernel. Each program's iterations touch ``start + k * step +
lanes``; they are apart across programs and iterations exactly when the step is at least the grid times the block,
which a launch's grid decides (``tl.num_programs(0)`` is the grid). A step shorter than that stays refused."""

import os

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import poison

assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
D = torch.float64
N, BLOCK = 101, 16  # n not a multiple of the block; 7 blocks


def rand(*shape):
    return torch.randn(*shape, dtype=D, device=DEVICE, requires_grad=True)


@triton.jit
def grid_stride_sin(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.sin(x) * x, mask=mask)


@triton.jit
def grid_stride_sin_named_step(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    step = tl.num_programs(0) * BLOCK  # named before the loop, through tl.range
    for start in tl.range(tl.program_id(0) * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.sin(x) * x, mask=mask)


@triton.jit
def grid_stride_weight(x_ptr, w_ptr, y_ptr, n, W, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        w = tl.load(w_ptr + offs % W, mask=mask)  # shared by every program: its gradient is a sum
        tl.store(y_ptr + offs, x * w + tl.exp(w) * 0.5, mask=mask)


@triton.jit
def grid_stride_too_short(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, BLOCK):  # every program runs to n from its own block: they meet
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def sin_reference(x):
    return torch.sin(x) * x


def weight_reference(x, w):
    ww = w[torch.arange(x.numel(), device=x.device) % w.numel()]
    return x * ww + torch.exp(ww) * 0.5


@pytest.mark.parametrize("kernel", [grid_stride_sin, grid_stride_sin_named_step])
@pytest.mark.parametrize("grid", [1, 2, 3, 6, 100])  # programs that loop (fewer than 7 blocks), and more than blocks
def test_a_grid_stride_loop_over_elements_through_a_bare_op(grid, kernel):
    @tritongrad.op
    def op(x):
        y = poison(torch.empty_like(x))
        kernel[(grid,)](x, y, x.numel(), BLOCK=BLOCK)
        return y

    x = rand(N)
    y = op(x)
    g = torch.randn_like(y)
    torch.testing.assert_close(y, sin_reference(x.detach()), rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y, x, g)[0]
    want = torch.autograd.grad(sin_reference(x), x, g)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grid", [1, 3, 5])
def test_a_grid_stride_loop_over_elements_through_grad(grid):
    bwd = tritongrad.grad(grid_stride_sin)
    x = rand(N)
    y = poison(torch.empty_like(x.detach()))
    named = {"x_ptr": x.detach(), "y_ptr": y, "n": N, "BLOCK": BLOCK}
    g = torch.randn(N, dtype=D, device=DEVICE)
    got = bwd.gradients((grid,), named, {"y_ptr": g})["x_ptr"]
    want = torch.autograd.grad(sin_reference(x), x, g)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grid,W", [(1, 7), (3, 7), (4, 13), (2, 37)])
def test_a_weight_at_offs_mod_w_in_a_grid_stride_loop(grid, W):
    @tritongrad.op
    def op(x, w):
        y = poison(torch.empty_like(x))
        grid_stride_weight[(grid,)](x, w, y, x.numel(), W, BLOCK=BLOCK)
        return y

    x, w = rand(N), rand(W)
    y = op(x, w)
    g = torch.randn_like(y)
    torch.testing.assert_close(y, weight_reference(x.detach(), w.detach()), rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y, (x, w), g)
    want = torch.autograd.grad(weight_reference(x, w), (x, w), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)

    bwd = tritongrad.grad(grid_stride_weight)  # and the derived kernel by itself
    named = {"x_ptr": x.detach(), "w_ptr": w.detach(), "y_ptr": poison(torch.empty_like(x.detach())), "n": N,
             "W": W, "BLOCK": BLOCK}
    direct = bwd.gradients((grid,), named, {"y_ptr": g})
    torch.testing.assert_close(direct["x_ptr"], want[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(direct["w_ptr"], want[1], rtol=1e-10, atol=1e-10)


def test_the_same_tensor_as_input_and_weight_in_a_grid_stride_loop():
    """``x`` passed as both ``x_ptr`` and ``w_ptr`` (W = n): its gradient gathers both loads' adjoints."""
    @tritongrad.op
    def op(x):
        y = poison(torch.empty_like(x))
        grid_stride_weight[(3,)](x, x, y, x.numel(), x.numel(), BLOCK=BLOCK)
        return y

    x = rand(N)
    y = op(x)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, x, g)[0]
    want = torch.autograd.grad(weight_reference(x, x), x, g)[0]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_grid_stride_step_shorter_than_the_grid_is_refused_saying_why():
    @tritongrad.op
    def op(x):
        y = poison(torch.empty_like(x))
        grid_stride_too_short[(3,)](x, y, x.numel(), BLOCK=BLOCK)
        return y

    with pytest.raises(NotDifferentiableError, match=r"(?s)grid-stride loop over `start`.*lanes of different "
                                                     r"programs reach one element.*shorter than the grid") as raised:
        op(rand(N)).sum().backward()
    assert raised.value.source_line.startswith("tl.store(y_ptr + offs")
