"""Kernel features beyond single operations: wrappers, half precision, dot with an
accumulator, asserts, index math, constexpr defaults. Each against torch autograd."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools.testing import backward_launch, poison


def assert_close(got, want, tol=1e-10):
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@triton.autotune(configs=[triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def tuned_tanhish(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    tl.store(y_ptr + offs, y, mask=mask)


@triton.heuristics({"BLOCK": lambda args: 16})
@triton.jit
def heuristic_square(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


@pytest.mark.parametrize("kernel, reference, block", [
    (tuned_tanhish, torch.tanh, 32),
    (heuristic_square, torch.square, 16),
])
def test_autotune_and_heuristics_wrappers_are_unwrapped(kernel, reference, block):
    n = 77
    x = torch.randn(n, dtype=torch.float64)
    y = poison(torch.empty_like(x))
    grid = (triton.cdiv(n, block),)
    kernel[grid](x, y, n)
    xs = x.clone().requires_grad_()
    want = reference(xs)
    assert_close(y, want.detach())
    dy = torch.randn_like(x)
    (want_grad,) = torch.autograd.grad(want, xs, dy)
    bwd = tritongrad.grad(kernel)
    assert bwd.forward is tritongrad.grad(kernel.fn).forward  # the same jit function underneath
    got = backward_launch(kernel, grid, (x, y, n), {"BLOCK": block}, {"y_ptr": dy})
    assert_close(got["x_ptr"], want_grad)


@triton.jit
def half_gelu_ish(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = x * tl.sigmoid(1.702 * x.to(tl.float32))
    tl.store(y_ptr + offs, y.to(tl.float16), mask=mask)


def test_half_precision_gradients_accumulate_in_float32():
    n = 300
    x = torch.randn(n).half()
    y = poison(torch.empty_like(x))
    half_gelu_ish[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    xs = x.float().requires_grad_()
    want = xs * torch.sigmoid(1.702 * xs)
    assert_close(y.float(), want.detach(), tol=2e-3)
    dy = torch.randn(n).half()
    (want_grad,) = torch.autograd.grad(want, xs, dy.float())
    bwd = tritongrad.grad(half_gelu_ish)
    dx = torch.zeros(n, dtype=torch.float32)  # the convention: float32 shadows for half inputs
    bwd[(triton.cdiv(n, 64),)](x, y, n, dy.float(), dx, BLOCK=64)
    assert_close(dx, want_grad, tol=1e-5)  # float32 accuracy: nothing was rounded to half on the way


@triton.jit
def dot_acc(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
    bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
    acc = tl.zeros((BM, BN), dtype=tl.float32) + bias[None, :]
    acc = tl.dot(a, b, acc, input_precision="ieee")
    acc = tl.dot(a * 2.0, b, acc, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def test_dot_with_accumulator():
    # float32: the compiler accumulates a dot in float32; "ieee" (not tf32), inherited by the backward's dots
    M, N, K = 19, 23, 29
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    c = poison(torch.empty(M, N))
    args = (a, b, c, bias, M, N, K)
    meta = {"BM": 32, "BN": 32, "BK": 32}
    dot_acc[(1,)](*args, **meta)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    want = 3 * leaves[0] @ leaves[1] + leaves[2]
    assert_close(c, want.detach(), tol=1e-4)
    dc = torch.randn(M, N)
    wanted = torch.autograd.grad(want, leaves, dc)
    got = backward_launch(dot_acc, (1,), args, meta, {"c_ptr": dc})
    for name, w in zip(("a_ptr", "b_ptr", "bias_ptr"), wanted, strict=True):
        assert_close(got[name], w, tol=1e-4)
    assert 'input_precision="ieee"' in tritongrad.grad(dot_acc).src.replace("'", '"')


@triton.jit
def index_math(x_ptr, y_ptr, n, scale: tl.constexpr = 3.0, BLOCK: tl.constexpr = 16):
    tl.static_assert(BLOCK >= 16)
    pid = tl.program_id(0)
    blocks = tl.cdiv(n, BLOCK)
    tl.device_assert(pid < blocks)
    offs = (pid % blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    ones = tl.full((BLOCK,), 1.0, tl.float64) + tl.zeros((BLOCK,), tl.float64)
    y = (x * scale + ones) * (tl.num_programs(0) - pid)
    tl.store(y_ptr + offs, y, mask=mask)


def test_index_math_asserts_and_constexpr_defaults():
    n = 41
    grid = (triton.cdiv(n, 16),)
    x = torch.randn(n, dtype=torch.float64)
    y = poison(torch.empty_like(x))
    index_math[grid](x, y, n)
    weight = (grid[0] - torch.arange(n) // 16).double()
    xs = x.clone().requires_grad_()
    want = (3.0 * xs + 1.0) * weight
    assert_close(y, want.detach())
    bwd = tritongrad.grad(index_math)
    assert "tl.static_assert(BLOCK >= 16)" in bwd.src and "tl.device_assert(pid < blocks)" in bwd.src
    dy = torch.randn_like(x)
    dx = torch.zeros_like(x)
    bwd[grid](x, y, n, dy, dx)  # the forward's defaults (scale, BLOCK) are applied at launch
    (want_grad,) = torch.autograd.grad(want, xs, dy)
    assert_close(dx, want_grad)


def test_launch_with_the_wrong_number_of_arguments_is_named():
    bwd = tritongrad.grad(index_math)
    with pytest.raises(TypeError, match="positional arguments"):
        bwd[(1,)](torch.zeros(3), torch.zeros(3), 3)


@triton.jit
def math_module_spellings(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    y = tl.math.exp(x) * tl.math.sin(x) + tl.math.sqrt(x * x + 1.0) * tl.math.rsqrt(x * x + 2.0)
    y += tl.math.log(x * x + 1.0)
    tl.store(y_ptr + offs, y, mask=mask)


def test_tl_math_spellings_have_the_same_rules():
    n = 37
    x = torch.randn(n, dtype=torch.float64)
    y = poison(torch.empty_like(x))
    math_module_spellings[(3,)](x, y, n, BLOCK=16)
    leaf = x.clone().requires_grad_()
    want = torch.exp(leaf) * torch.sin(leaf) + torch.sqrt(leaf**2 + 1) * torch.rsqrt(leaf**2 + 2)
    want = want + torch.log(leaf**2 + 1)
    assert_close(y, want.detach())
    d_y = torch.randn_like(x)
    got = backward_launch(math_module_spellings, (3,), (x, y, n), {"BLOCK": 16}, {"y_ptr": d_y})
    assert_close(got["x_ptr"], torch.autograd.grad(want, leaf, d_y)[0])
