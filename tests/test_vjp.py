"""Seed 002: ``fn1``'s vector-Jacobian product, used in a hand-written backward kernel, against torch."""

import re

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.examples import fn1
from tritongrad.tools.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}

fn1_back = tritongrad.vjp(fn1.fn1, wrt=(0, 1))


@triton.jit
def tr_backward(X, Y, dX, dY, dZ):  # seed 002's boilerplate load and backward
    r = tl.arange(0, 16)
    r2 = tl.arange(0, 16)
    x = tl.load(X + r)
    y = tl.load(Y + r2)
    dz = tl.load(dZ + 16 * r2[:, None] + r)
    dx, dy = fn1_back(x, y, dz)
    tl.store(dX + r, dx)
    tl.store(dY + r2, dy)


def torch_grads(x, y, dz):
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    return torch.autograd.grad(fn1.reference(x, y), (x, y), dz)


@pytest.fixture
def inputs(device):
    x, y = fn1.make_inputs(device=device, dtype=DTYPE)
    return x, y, torch.randn(16, 16, device=device, dtype=DTYPE)


def test_forward(inputs):
    x, y, _ = inputs
    launch = fn1.tr_forward_launch(x, y)
    poison(launch.out)
    torch.testing.assert_close(launch(), fn1.reference(x, y), **TOL)


def test_vjp_in_hand_written_backward(inputs):
    x, y, dz = inputs
    dx, dy = poison(torch.empty_like(x)), poison(torch.empty_like(y))
    tr_backward[(1,)](x, y, dx, dy, dz)
    want_dx, want_dy = torch_grads(x, y, dz)
    torch.testing.assert_close(dx, want_dx, **TOL)
    torch.testing.assert_close(dy, want_dy, **TOL)


def test_derived_kernel_backward_agrees(inputs):
    x, y, dz = inputs
    launch = fn1.tr_forward_launch(x, y)
    launch()
    got = backward_launch(fn1.tr_forward, launch.grid, launch.args, launch.kwargs, {"Z": dz})
    want_dx, want_dy = torch_grads(x, y, dz)
    torch.testing.assert_close(got["X"], want_dx, **TOL)
    torch.testing.assert_close(got["Y"], want_dy, **TOL)


@triton.jit
def dx_only(X, Y, dX, dZ):
    r = tl.arange(0, 16)
    x = tl.load(X + r)
    y = tl.load(Y + r)
    dz = tl.load(dZ + 16 * r[:, None] + r)
    dx = fn1_dx(x, y, dz)
    tl.store(dX + r, dx)


fn1_dx = tritongrad.vjp(fn1.fn1, wrt=(0,))


def test_vjp_wrt_one_argument(inputs):
    x, y, dz = inputs
    dx = poison(torch.empty_like(x))
    dx_only[(1,)](x, y, dx, dz)
    torch.testing.assert_close(dx, torch_grads(x, y, dz)[0], **TOL)


def test_vjp_source_reads_like_seed_002():
    src = fn1_back.tg_src
    # the text is the point (it reads like seed 002's): test_vjp_in_hand_written_backward checks this vjp's gradients
    assert src.startswith("@triton.jit\ndef fn1_vjp(x, y, ")
    comments = re.findall(r"^ *# grad of: (.*)$", src, flags=re.M)
    assert "c = a + b" in comments
    assert "a = tl.exp(x)" in comments
    assert "b = tl.log(tl.expand_dims(y, 1))" in comments
    assert any(line.startswith("return a * b + tl.dot(c, c)") for line in comments), comments
    for name in ("a", "b", "c", "d_a", "d_b", "d_c", "d_x", "d_y"):
        assert re.search(rf"\b{name}\b", src), f"`{name}` missing from\n{src}"
    assert re.search(r"^    return \(?d_x, d_y\)?$", src, flags=re.M), src


def test_vjp_bad_position():
    with pytest.raises(ValueError, match="wrt"):
        tritongrad.vjp(fn1.fn1, wrt=(2,))
