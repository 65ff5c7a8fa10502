"""Exponentials in base two (exponentials.py): a derived kernel computes ``tl.exp`` as ``tg.exp`` (exp2 in
float32) where only arithmetic reads its value, and keeps the forward's ``tl.exp`` where a decision does. The
kernels against PyTorch autograd (float32 and float64, sizes that are not powers of two, NaN-poisoned
outputs); the pass itself on bodies written to reach each kind of reader."""

import ast

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.codegen.exponentials import base_two_exponentials
from tritongrad.tools.testing import assert_gradients_match, poison


@triton.jit
def softmax_rows(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + tl.program_id(0) * N + cols, mask=mask, other=float("-inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + tl.program_id(0) * N + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def gated_exp(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """``e = exp(x)`` where it exceeds 1.5, else ``x``: the comparison reads the exponential."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    e = tl.exp(x)
    tl.store(y_ptr + offs, tl.where(e > 1.5, e * w, x), mask=mask)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_an_exponential_only_arithmetic_reads_is_computed_in_base_two(dtype, tol):
    rows, n = 7, 37
    x = torch.randn(rows, n, dtype=dtype) * 3
    y = poison(torch.empty_like(x))
    args, kwargs, grid = (x, y, n), {"BLOCK": 64}, (rows,)
    softmax_rows[grid](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    want = torch.softmax(leaf, dim=1)
    torch.testing.assert_close(y, want.detach(), rtol=tol, atol=tol)
    assert_gradients_match(softmax_rows, grid, args, kwargs, y, want, [leaf], ["x_ptr"], tol=tol)
    code = [line for line in tritongrad.grad(softmax_rows).src.splitlines() if not line.strip().startswith("#")]
    # the softmax is one operation (composites.py), its exponential in base two as well
    assert any("tg.softmax_base_two(" in line for line in code) and not any("tl.exp(" in line for line in code)


def test_an_exponential_a_comparison_reads_keeps_the_forwards_exp():
    n = 45
    x, w = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    y = poison(torch.empty_like(x))
    args, kwargs, grid = (x, w, y, n), {"BLOCK": 16}, (triton.cdiv(n, 16),)
    gated_exp[grid](*args, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    e = torch.exp(leaves[0])
    want = torch.where(e > 1.5, e * leaves[1], leaves[0])
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(gated_exp, grid, args, kwargs, y, want, leaves, ["x_ptr", "w_ptr"])
    src = tritongrad.grad(gated_exp).src
    assert "tg.exp(" not in src and "e = tl.exp(x)" in src


# -- the pass on its own ---------------------------------------------------------------------------------------

def _rewritten(body: str) -> str:
    return ast.unparse(ast.Module(base_two_exponentials(ast.parse(body).body), []))


@pytest.mark.parametrize("reader", [
    "y = tl.sum(e * w, axis=1)",
    "y = tl.dot(e.to(v.dtype), v)",
    "y = tl.where(m, e, 0.0) - 1.0",
    "y = tg.unbroadcast(g * e, e)\ntl.store(p, y, mask=m)",
    "tl.atomic_add(p, -e[:, None], mask=m, sem='relaxed')",
    "y = tl.reshape(e, (4, 4)) / tl.sqrt(w)\nz = y.shape",
    "for i in range(n):\n    acc += tl.trans(e) * i",
])
def test_arithmetic_readers_take_the_base_two_exponential(reader):
    assert "e = tg.exp(x - c)" in _rewritten(f"e = tl.exp(x - c)\n{reader}")


@pytest.mark.parametrize("reader", [
    "y = e > 0.5",  # a comparison
    "y = tl.where(e < w, x, w)",  # a where's condition
    "y = tl.max(e, axis=0)",  # a max: its gradient picks the elements equal to it
    "y = tl.maximum(e, w)",
    "y = tl.load(p + e.to(tl.int32))",  # an address
    "i = e.to(tl.int64)\ny = i * w",  # an integer cast, even where arithmetic reads it
    "i = e.to(tl.int32)\ny = tl.load(p + i)",  # through an assignment and a cast
    "z = e * 2.0\nif tl.sum(z, axis=0) > 1.0:\n    y = x",  # a branch's test, two assignments on
    "for i in range(0, e):\n    y = i",  # a loop's bound
    "y = e // 2.0",  # floor division
    "y = (e, x)",  # a tuple: not followed
])
def test_a_decision_reading_an_exponential_keeps_the_forwards_exp(reader):
    assert "e = tl.exp(x - c)" in _rewritten(f"e = tl.exp(x - c)\n{reader}")


def test_each_exponential_is_judged_on_its_own_readers():
    body = "a = tl.exp(x)\nb = tl.exp(x)\ny = tl.sum(a, axis=0)\nz = b > 1.0\nw = tl.exp(2.0)"
    assert _rewritten(body).splitlines()[:2] == ["a = tg.exp(x)", "b = tl.exp(x)"]
    assert "w = tl.exp(2.0)" in _rewritten(body)  # a constant: not a tensor with a dtype
