"""early_loads.py: a derived kernel's loads issued as soon as their operands are known, never across a write."""

import ast

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.codegen.early_loads import issue_loads_early
from tritongrad.reverse.sweep import MARKER, comment_marker
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

F64 = torch.float64


def moved(src: str) -> list[str]:
    """The statements of ``src`` after the pass, comments dropped, as source lines."""
    body = issue_loads_early(ast.parse(src).body, lambda text: comment_marker({}, text))
    return [line for line in ast.unparse(ast.Module(body, [])).splitlines() if MARKER not in line]


def test_a_load_moves_above_the_work_it_does_not_read():
    assert moved("m = tl.max(x, 0)\nz = x - m\nd = tl.load(p + offs, mask=mask)\ny = d * z") == [
        "d = tl.load(p + offs, mask=mask)", "m = tl.max(x, 0)", "z = x - m", "y = d * z"]


def test_a_load_stays_after_what_computes_its_operands():
    assert moved("m = tl.max(x, 0)\nd = tl.load(p + m)") == ["m = tl.max(x, 0)", "d = tl.load(p + m)"]
    # and after a statement reading the name it assigns (not SSA: a reassigned name)
    assert moved("d = 1.0\nt = d * 2\nd = tl.load(p)") == ["d = 1.0", "t = d * 2", "d = tl.load(p)"]


@pytest.mark.parametrize("write", ["tl.store(q, s)", "tl.atomic_add(q, s, sem='relaxed')", "tl.debug_barrier()",
                                   "tg.add_later(q, s)", "t = helper(s)"])
def test_a_load_never_crosses_a_write_or_an_unknown_call(write):
    src = f"s = tl.sum(a, 0)\n{write}\nu = s * 2\nb = tl.load(r)"
    assert moved(src) == ["s = tl.sum(a, 0)", ast.unparse(ast.parse(write)), "b = tl.load(r)", "u = s * 2"]


def test_loads_keep_their_order_and_their_block():
    assert moved("a = tl.load(p)\nt = a * 2\nb = tl.load(q)\nc = tl.load(r)") == [
        "a = tl.load(p)", "b = tl.load(q)", "c = tl.load(r)", "t = a * 2"]
    src = "w = x * 2\nfor i in range(n):\n    s = tl.sum(w, 0)\n    b = tl.load(p + i)\n    acc += b * s"
    assert moved(src) == ["w = x * 2", "for i in range(n):", "    b = tl.load(p + i)", "    s = tl.sum(w, 0)",
                          "    acc += b * s"]


@triton.jit
def softmax_rows(x_ptr, y_ptr, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


def test_the_output_gradient_is_loaded_before_the_recomputed_reductions():
    src = tritongrad.grad(softmax_rows).src
    body = src.split('"""')[2]
    assert body.index("tl.load(d_y_ptr") < body.index("tl.max(")
    assert "`d_e_over_sum_e`: loaded above, ahead of its first use" in body
    rows, n = 5, 37
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, y, n, n), {"BLOCK": 64}
    softmax_rows[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    assert_gradients_match(softmax_rows, (rows,), args, kwargs, y, torch.softmax(leaf, dim=1), [leaf], ["x_ptr"])


@triton.jit
def scale_in_place(x_ptr, w_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    w = tl.load(w_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, tl.sum(x * w, axis=0) * x, mask=mask)


def test_an_in_place_update_keeps_its_shadow_read_before_the_shadow_is_zeroed():
    body = tritongrad.grad(scale_in_place).src.split('"""')[2]
    read = body.index("tl.load(d_x_ptr")
    assert read < body.index("tl.debug_barrier()")
    n, block = 45, 16
    x, w = torch.randn(n, dtype=F64), torch.randn(n, dtype=F64)
    grid = (triton.cdiv(n, block),)
    updated = x.clone()
    scale_in_place[grid](updated, w, n, BLOCK=block)
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    blocks = [torch.nn.functional.pad(t, (0, -n % block)).view(-1, block) for t in leaves]  # a sum per program
    want = ((blocks[0] * blocks[1]).sum(1, keepdim=True) * blocks[0]).flatten()[:n]
    torch.testing.assert_close(updated, want.detach())
    g = torch.randn(n, dtype=F64)  # x_ptr: the values before the update; its shadow: the new values' gradient
    got = backward_launch(scale_in_place, grid, (x.clone(), w, n), {"BLOCK": block}, {"x_ptr": g})
    for name, expected in zip(("x_ptr", "w_ptr"), torch.autograd.grad(want, leaves, g), strict=True):
        torch.testing.assert_close(got[name], expected, rtol=1e-10, atol=1e-10)
