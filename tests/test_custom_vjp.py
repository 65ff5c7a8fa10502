"""tritongrad.custom_vjp: hand-written adjoints for @triton.jit helpers; argmax carries no gradient.

Float64, sizes not powers of two, several programs, NaN-poisoned outputs, random upstream gradients.
"""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}
N, BLOCK = 77, 16
GRID = (triton.cdiv(N, BLOCK),)


@triton.jit
def frac(x):
    return x % 1.0  # `%` has no rule: only a custom one makes kernels calling this differentiable


@triton.jit
def frac_grad(x, out, g):
    return g


@triton.jit
def uses_frac(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, frac(x * x) * x, mask=mask)


def run(kernel, x, others, reference, names, **meta):
    y = poison(torch.empty_like(x))
    args = (x, *others, y, N)
    kernel[GRID](*args, BLOCK=BLOCK, **meta)
    leaves = [t.clone().requires_grad_() for t in (x, *others)]
    want = reference(*leaves)
    torch.testing.assert_close(y, want.detach(), **TOL)
    dy = torch.randn_like(y)
    got = backward_launch(kernel, GRID, args, {"BLOCK": BLOCK, **meta}, {"y_ptr": dy})
    wanted = torch.autograd.grad(want, leaves[: len(names)], dy)
    for name, w in zip(names, wanted, strict=True):
        torch.testing.assert_close(got[name], w, **TOL)
    return tritongrad.grad(kernel).src


def test_a_helper_without_a_rule_is_refused_until_it_has_a_custom_one():
    from tritongrad.core.operations import CUSTOM

    CUSTOM.pop(frac.fn, None)
    tritongrad.runtime.derive.clear_cache()
    with pytest.raises(NotDifferentiableError, match="`%`"):
        tritongrad.grad(uses_frac)
    tritongrad.custom_vjp(frac, frac_grad)
    src = run(uses_frac, 3 * torch.randn(N, dtype=DTYPE), (), lambda x: torch.frac(x * x + 100) * x, ("x_ptr",))
    assert "frac_1 = frac(x_times_x)" in src and "frac_grad(x_times_x, frac_1, d_frac_1)" in src, src


@triton.jit
def _softclip_grad(x, limit, out, g):
    return g * (1.0 - (out / limit) * (out / limit)), g * (out / limit - x * (1.0 - (out / limit) * (out / limit))
                                                            / limit)


@tritongrad.custom_vjp(_softclip_grad, wrt=(0, 1))
@triton.jit
def softclip(x, limit):
    return limit * (2.0 * tl.sigmoid(2.0 * x / limit) - 1.0)  # limit * tanh(x / limit)


@triton.jit
def uses_softclip(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + pid)
    tl.store(y_ptr + offs, softclip(x, s), mask=mask)


def test_custom_rule_with_two_differentiated_arguments():
    s = torch.rand(GRID[0], dtype=DTYPE) + 0.5

    def reference(x, s):
        limit = s.repeat_interleave(BLOCK)[:N]
        return limit * torch.tanh(x / limit)

    src = run(uses_softclip, 2 * torch.randn(N, dtype=DTYPE), (s,), reference, ("x_ptr", "s_ptr"))
    assert "d_s = tg.unbroadcast(_softclip_grad(x, s, softclip_1, d_softclip_1)[1], s)" in src, src


def test_custom_rule_errors():
    with pytest.raises(ValueError, match="wrt"):
        tritongrad.custom_vjp(frac, frac_grad, wrt=(3,))

    @triton.jit
    def takes_g(g):
        return g

    with pytest.raises(ValueError, match="'g'"):
        tritongrad.custom_vjp(takes_g, frac_grad)


@triton.jit
def pick_at_argmax(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    i = tl.argmax(tl.where(offs < N, x, float("-inf")), 0)  # an index: no gradient flows through it to x
    w = tl.load(w_ptr + i)
    tl.store(y_ptr + offs, w * x, mask=offs < N)


def test_argmax_carries_no_gradient():
    x, w = torch.randn(N, dtype=DTYPE), torch.randn(N, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    pick_at_argmax[(1,)](x, w, y, N, BLOCK=128)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = wr[torch.argmax(xr)] * xr
    torch.testing.assert_close(y, want.detach(), **TOL)
    dy = torch.randn_like(y)
    got = backward_launch(pick_at_argmax, (1,), (x, w, y, N), {"BLOCK": 128}, {"y_ptr": dy}, wrt=("x_ptr", "w_ptr"))
    want_x, want_w = torch.autograd.grad(want, (xr, wr), dy)
    torch.testing.assert_close(got["x_ptr"], want_x, **TOL)
    torch.testing.assert_close(got["w_ptr"], want_w, **TOL)


@triton.jit
def _product(a, b):
    return a * b


@triton.jit
def reduce_with_product(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=1.0)
    tl.store(y_ptr, tl.reduce(x, 0, _product))  # refused


def test_reduce_with_an_unknown_combine_is_refused():
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(reduce_with_product)
    assert "`_product`, which is not a sum, max or min" in info.value.construct
    assert info.value.source_line.endswith("# refused")


@triton.jit
def _softplus_grad(x, out, g):
    return g * tl.sigmoid(x)  # exact in both tails, unlike g * (1 - exp(-out))


@tritongrad.custom_vjp(_softplus_grad)
@triton.jit
def stable_softplus(x):
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def uses_softplus(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, stable_softplus(2.0 * x) * x, mask=mask)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # sigmoid(-1600) = 1 / (1 + inf) = 0
def test_numerically_stable_softplus_with_its_own_rule():
    x = 30 * torch.randn(N, dtype=DTYPE)  # far into both tails, where exp(x) overflows float32
    x[:4] = torch.tensor([-800.0, 800.0, 0.0, -1e-3], dtype=DTYPE)  # exp(800) is inf even in float64
    src = run(uses_softplus, x, (), lambda x: torch.logaddexp(2.0 * x, torch.zeros_like(x)) * x, ("x_ptr",))
    assert "_softplus_grad(" in src and "tl.abs" not in src.split("# grad of")[1], src
