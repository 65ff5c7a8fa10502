"""Block pointers (``tl.make_block_ptr``, ``tl.advance``): rewritten into pointer arithmetic, then derived.

The derived backward has no block pointers, so it runs on every Triton; the forwards need a
Triton that still has them (3.8 and older) and are checked against the reference there.
Gradients are always checked against torch autograd on a plain-PyTorch reference (float64,
ragged sizes, several programs, NaN-poisoned outputs, random upstream gradients).
"""

import inspect

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import assert_gradients_match, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


def has_block_pointers() -> bool:
    @triton.jit
    def probe(x_ptr):
        p = tl.make_block_ptr(x_ptr, (1,), (1,), (0,), (1,), (0,))
        tl.store(p, tl.load(p))

    try:
        probe[(1,)](torch.zeros(1))
    except Exception:  # Triton 3.9 removed them
        return False
    return True


BLOCK_POINTERS = has_block_pointers()


def check(kernel, grid, args, meta, out, want, leaves, names):
    """The forward (where Triton still runs it) and the derived gradients against autograd's."""
    if BLOCK_POINTERS:
        kernel[grid](*args, **meta)
        torch.testing.assert_close(out, want.detach(), **TOL)
    assert_gradients_match(kernel, grid, args, meta, out, want, leaves, names)


@triton.jit
def scaled_rows(x_ptr, w_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = sin(x) * w over a tile of rows; both dimensions ragged (boundary_check on both)."""
    row = tl.program_id(0) * BLOCK_M
    x_block = tl.make_block_ptr(base=x_ptr, shape=(M, N), strides=(N, 1), offsets=(row, 0),
                                block_shape=(BLOCK_M, BLOCK_N), order=(1, 0))
    w_block = tl.make_block_ptr(w_ptr, (N,), (1,), (0,), (BLOCK_N,), (0,))
    y_block = tl.make_block_ptr(y_ptr, (M, N), (N, 1), (row, 0), (BLOCK_M, BLOCK_N), (1, 0))
    x = tl.load(x_block, boundary_check=(0, 1), padding_option="zero")
    w = tl.load(w_block, boundary_check=(0,))
    tl.store(y_block, tl.sin(x) * w[None, :], boundary_check=(1, 0))


def test_rows_with_boundary_checks():
    m, n = 11, 13
    x, w = torch.randn(m, n, dtype=DTYPE), torch.randn(n, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    want = torch.sin(leaves[0]) * leaves[1]
    meta = {"BLOCK_M": 4, "BLOCK_N": 16}
    check(scaled_rows, (triton.cdiv(m, 4),), (x, w, y, m, n), meta, y, want, leaves, ("x_ptr", "w_ptr"))


@triton.jit
def matmul_advance(a_ptr, b_ptr, c_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
                   K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ B, the K loop advancing block pointers (the tutorial's pattern; K constexpr for Triton 3.2's
    interpreter, which cannot loop to a runtime bound)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    a_block = tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, 0),
                                (BLOCK_M, BLOCK_K), (1, 0))
    b_block = tl.make_block_ptr(b_ptr, (K, N), (stride_bk, stride_bn), (0, pid_n * BLOCK_N),
                                (BLOCK_K, BLOCK_N), (0, 1))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_block, boundary_check=(0, 1))
        b = tl.load(b_block, boundary_check=(0, 1))
        acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)  # tl.dot has no float64 in Triton 3.2's interpreter
        a_block = tl.advance(a_block, (0, BLOCK_K))
        b_block = tl.advance(b_block, (BLOCK_K, 0))
    c_block = tl.make_block_ptr(c_ptr, (M, N), (N, 1), (pid_m * BLOCK_M, pid_n * BLOCK_N), (BLOCK_M, BLOCK_N),
                                (1, 0))
    tl.store(c_block, acc, boundary_check=(0, 1))


@pytest.mark.parametrize("transposed_a", [False, True])
def test_matmul_advancing_in_a_loop(transposed_a):
    m, n, k = 9, 10, 21
    a = torch.randn(k, m, dtype=DTYPE).T if transposed_a else torch.randn(m, k, dtype=DTYPE)
    b = torch.randn(k, n, dtype=DTYPE)
    c = poison(torch.empty(m, n, dtype=DTYPE))
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    want = leaves[0] @ leaves[1]
    args = (a, b, c, m, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    meta = {"K": k, "BLOCK_M": 8, "BLOCK_N": 8, "BLOCK_K": 8}
    check(matmul_advance, (2, 2), args, meta, c, want, leaves, ("a_ptr", "b_ptr"))


def test_backward_source_uses_plain_pointers():
    src = tritongrad.grad(matmul_advance).src
    # the text is the point (no block pointers left): test_matmul_advancing_in_a_loop checks this kernel's gradients
    assert "make_block_ptr" not in src and "tl.advance" not in src
    assert "tl.atomic_add(d_a_block" in src


@triton.jit
def block_pointer_to_helper(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    p = tl.make_block_ptr(x_ptr, (N,), (1,), (0,), (BLOCK,), (0,))
    tl.store(y_ptr + tl.arange(0, BLOCK), load_twice(p))  # refused: a block pointer passed on


@triton.jit
def load_twice(p):
    return tl.load(p) * 2.0


@triton.jit
def block_pointer_inline(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x = tl.load(tl.make_block_ptr(x_ptr, (N,), (1,), (0,), (BLOCK,), (0,)))  # refused
    tl.store(y_ptr + tl.arange(0, BLOCK), x)


@pytest.mark.parametrize("kernel, construct", [
    (block_pointer_to_helper, "using the block pointer `p` other than to load, store or advance"),
    (block_pointer_inline, "`tl.make_block_ptr` inside an expression"),
])
def test_other_uses_are_refused_with_their_line(kernel, construct):
    with pytest.raises(NotDifferentiableError) as e:
        tritongrad.grad(kernel)
    assert construct in str(e.value)
    lines, first = inspect.getsourcelines(kernel.fn)
    assert e.value.line == first + next(i for i, line in enumerate(lines) if "# refused" in line)
