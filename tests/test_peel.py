"""Loops split where their masks hold in every lane (peel.py): the derived kernels run the iterations whose
`tl.where` masks are all true in a copy of the loop without them. Each kernel against PyTorch autograd on a
plain-PyTorch reference (float64, sizes that are not multiples of the block, NaN-poisoned outputs), with the
split found at the start, the middle and the end of the iterations."""

import ast

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.codegen.peel import split_at_masks
from tritongrad.tools.testing import assert_gradients_match, poison

F64 = torch.float64


@triton.jit
def row_sums_up_to(x_ptr, y_ptr, N, LIMIT, B: tl.constexpr):
    """Lane j of row p sums exp(x[p, c]) over the columns c = j (mod B) before min(N, LIMIT + p): the mask
    holds in every lane of the first blocks (a causal mask's shape)."""
    pid = tl.program_id(0)
    acc = tl.zeros((B,), dtype=tl.float64)
    for start in range(0, N, B):
        cols = start + tl.arange(0, B)
        x = tl.load(x_ptr + pid * N + cols, mask=cols < N, other=0.0)
        keep = (cols < N) & (cols < LIMIT + pid)
        acc += tl.where(keep, tl.exp(x), 0.0)
    tl.store(y_ptr + pid * B + tl.arange(0, B), acc)


@triton.jit
def row_sums_from(x_ptr, y_ptr, N, FIRST, B: tl.constexpr):
    """The same from column FIRST on: the mask holds in every lane of the last blocks."""
    pid = tl.program_id(0)
    acc = tl.zeros((B,), dtype=tl.float64)
    for start in range(B, N + B, B):
        cols = start - B + tl.arange(0, B)
        x = tl.load(x_ptr + pid * N + cols, mask=cols < N, other=0.0)
        acc += tl.where(cols >= FIRST, tl.sin(x), 0.0)
    tl.store(y_ptr + pid * B + tl.arange(0, B), acc)


@triton.jit
def broadcast_rows(v_ptr, y_ptr, N, R: tl.constexpr, B: tl.constexpr):
    """A mask of R x B lanes selecting a row vector: the select broadcasts it (its gradient sums R rows)."""
    rows = tl.arange(0, R)
    acc = tl.zeros((R, B), dtype=tl.float64)
    for start in range(0, N, B):
        cols = start + tl.arange(0, B)
        v = tl.load(v_ptr + cols, mask=cols < N, other=0.0)
        acc += tl.where((cols[None, :] < N) & (rows[:, None] >= 0), v[None, :] * v[None, :], 0.0)
    tl.store(y_ptr + rows[:, None] * B + tl.arange(0, B)[None, :], acc)


@triton.jit
def positive_parts(x_ptr, y_ptr, N, B: tl.constexpr):
    """A mask read from memory: nothing to prove, the loop stays as written."""
    acc = tl.zeros((B,), dtype=tl.float64)
    for start in range(0, N, B):
        cols = start + tl.arange(0, B)
        x = tl.load(x_ptr + cols, mask=cols < N, other=0.0)
        acc += tl.where(x > 0, x * x, 0.0)
    tl.store(y_ptr + tl.arange(0, B), acc)


@triton.jit
def row_sums_in_a_branch(x_ptr, y_ptr, N, M, B: tl.constexpr):
    """The blocks starting before M only: the mask is defined inside the loop's branch (split there)."""
    pid = tl.program_id(0)
    acc = tl.zeros((B,), dtype=tl.float64)
    for start in range(0, N, B):
        if start < M:
            cols = start + tl.arange(0, B)
            x = tl.load(x_ptr + pid * N + cols, mask=cols < N, other=0.0)
            acc += tl.where(cols < N, tl.exp(x), 0.0)
    tl.store(y_ptr + pid * B + tl.arange(0, B), acc)


def _blocked(x: torch.Tensor, keep: torch.Tensor, b: int) -> torch.Tensor:
    """Rows of ``x`` (masked by ``keep``) summed per lane of a block of ``b`` columns."""
    rows, n = x.shape
    pad = -n % b
    x = torch.nn.functional.pad(x * keep, (0, pad))
    return x.reshape(rows, -1, b).sum(1)


def _source(kernel) -> str:
    return tritongrad.grad(kernel).src


@pytest.mark.parametrize("limit", [0, 9, 100])  # split before the first block, inside, after the last
def test_a_prefix_of_blocks_runs_without_the_mask(limit):
    rows, n, b = 3, 37, 8
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, b, dtype=F64))
    args, kwargs = (x, y, n, limit), {"B": b}
    row_sums_up_to[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    cols = torch.arange(n)[None, :]
    keep = cols < torch.clamp(limit + torch.arange(rows)[:, None], max=n)
    assert_gradients_match(row_sums_up_to, (rows,), args, kwargs, y, _blocked(torch.exp(leaf), keep, b), [leaf],
                           ["x_ptr"])
    src = _source(row_sums_up_to)
    assert "(the first ones, found by a binary search)" in src and "tl.where(keep | True" in src


@pytest.mark.parametrize("first", [0, 13, 50])
def test_a_suffix_of_blocks_runs_without_the_mask(first):
    rows, n, b = 2, 29, 8
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, b, dtype=F64))
    args, kwargs = (x, y, n, first), {"B": b}
    row_sums_from[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    keep = (torch.arange(n) >= first)[None, :]
    assert_gradients_match(row_sums_from, (rows,), args, kwargs, y, _blocked(torch.sin(leaf), keep, b), [leaf],
                           ["x_ptr"])
    assert "(the last ones, found by a binary search)" in _source(row_sums_from)


def test_an_unmasked_select_keeps_the_masks_shape():
    """Dropping the mask must not drop its broadcast: v's gradient still sums over the R rows."""
    n, r, b = 21, 4, 8
    v = torch.randn(n, dtype=F64)
    y = poison(torch.empty(r, b, dtype=F64))
    args, kwargs = (v, y, n), {"R": r, "B": b}
    broadcast_rows[(1,)](*args, **kwargs)
    leaf = v.clone().requires_grad_()
    want = _blocked((leaf * leaf)[None, :].expand(r, n), torch.ones(r, n, dtype=torch.bool), b)
    assert_gradients_match(broadcast_rows, (1,), args, kwargs, y, want, [leaf], ["v_ptr"])
    assert "| True" in _source(broadcast_rows)


def test_a_mask_read_from_memory_is_left_as_written():
    n, b = 19, 8
    x = torch.randn(n, dtype=F64)
    y = poison(torch.empty(b, dtype=F64))
    args, kwargs = (x, y, n), {"B": b}
    positive_parts[(1,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    want = _blocked((torch.relu(leaf) * leaf)[None, :], torch.ones(1, n, dtype=torch.bool), b)[0]
    assert_gradients_match(positive_parts, (1,), args, kwargs, y, want, [leaf], ["x_ptr"])
    assert "| True" not in _source(positive_parts)


def _split(src: str) -> str:
    body = ast.parse(src).body
    taken = {n.id for n in ast.walk(ast.Module(body, [])) if isinstance(n, ast.Name)}
    return ast.unparse(split_at_masks(body, taken, lambda text: ast.Expr(ast.Constant(text))))


@pytest.mark.parametrize("src", [
    # the mask is the previous iteration's (assigned after the select)
    "m = c < N\nfor s in range(0, N, B):\n    y = tl.where(m, x, 0.0)\n    m = s + tl.arange(0, B) < N",
    # a rate of unknown sign: K may be negative
    "for s in range(0, N, B):\n    c = s * K + tl.arange(0, B)\n    y = tl.where(c < N, x, 0.0)",
    # a step of unknown sign
    "for s in range(0, N, S):\n    c = s + tl.arange(0, B)\n    y = tl.where(c < N, x, 0.0)",
    # one mask holding on a prefix (c < N) and a suffix (c >= F) of the iterations
    "for s in range(0, N, B):\n    c = s + tl.arange(0, B)\n    y = tl.where((c < N) & (c >= F), x, 0.0)",
    # a name the loop assigns twice
    "for s in range(0, N, B):\n    c = s + tl.arange(0, B)\n    c = c + 1\n    y = tl.where(c < N, x, 0.0)",
    # the mask inside a nested loop
    "for s in range(0, N, B):\n    for t in range(0, 4):\n        y = tl.where(s + tl.arange(0, B) < N, x, 0.0)",
])
def test_what_the_pass_cannot_prove_is_left_as_written(src):
    assert _split(src) == ast.unparse(ast.parse(src))


def test_a_mask_defined_in_a_branch_is_split_in_it():  # the text is the point: its gradient is checked by the
    # next test, test_a_kernel_whose_mask_is_defined_in_a_branch_gets_pytorchs_gradients
    src = ("for s in range(0, N, B):\n    if s < M:\n        c = s + tl.arange(0, B)\n"
           "        y = tl.where(c < N, x, 0.0)")
    out = _split(src)
    assert "tl.where((c < N) | True, x, 0.0)" in out and out.count("for s in range") == 2


@pytest.mark.parametrize("m", [0, 17, 100])  # no block, some, every block (the masked last one among them)
def test_a_kernel_whose_mask_is_defined_in_a_branch_gets_pytorchs_gradients(m):
    rows, n, b = 2, 37, 8
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, b, dtype=F64))
    args, kwargs = (x, y, n, m), {"B": b}
    row_sums_in_a_branch[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    keep = (torch.arange(n) // b * b < m)[None, :]  # (the columns of the blocks starting before m)
    assert_gradients_match(row_sums_in_a_branch, (rows,), args, kwargs, y, _blocked(torch.exp(leaf), keep, b),
                           [leaf], ["x_ptr"])
