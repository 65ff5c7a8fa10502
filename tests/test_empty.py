"""Ops on empty tensors: the gradient of every input that requires grad is zeros of its shape, as PyTorch's, whether
the input itself has no element (a (0, n) batch), an output has none (nothing to pass back), or a launch ran no
program (a grid of 0). Checked against PyTorch autograd in float64; the bundled examples' launchers take a row of no
columns too."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools import cli

BLOCK = 32


@triton.jit
def scale_rows(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y[r, :] = x[r, :] * w: w's gradient sums over the rows."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(y_ptr + row * n + cols, x * w, mask=mask)


@triton.jit
def weighted_row_sum(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y += x[r, :] * w for each row r (added atomically): y keeps its elements when x has no row."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.atomic_add(y_ptr + cols, x * w, mask=mask)


@tritongrad.op
def scaled(x, w):
    y = torch.empty_like(x)
    scale_rows[(x.shape[0],)](x, w, y, x.shape[1], BLOCK=BLOCK)
    return y


@tritongrad.op("tritongrad_tests::scaled_named")
def scaled_named(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    scale_rows[(x.shape[0],)](x, w, y, x.shape[1], BLOCK=BLOCK)
    return y


@tritongrad.op
def row_sum(x, w):
    y = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    weighted_row_sum[(x.shape[0],)](x, w, y, x.shape[1], BLOCK=BLOCK)
    return y


def _check(op, twin, shape, device):
    x = torch.randn(shape, dtype=torch.float64, device=device)
    w = torch.randn(shape[1], dtype=torch.float64, device=device)
    ours = [t.clone().requires_grad_() for t in (x, w)]
    theirs = [t.clone().requires_grad_() for t in (x, w)]
    got, want = op(*ours), twin(*theirs)
    torch.testing.assert_close(got, want.detach())
    upstream = torch.randn_like(want)
    derived = torch.autograd.grad(got, ours, upstream)
    expected = torch.autograd.grad(want, theirs, upstream)
    for d, e in zip(derived, expected, strict=True):
        assert d is not None and d.shape == e.shape and d.dtype == e.dtype
        torch.testing.assert_close(d, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", [scaled, scaled_named], ids=["bare", "named"])
@pytest.mark.parametrize("shape", [(0, 13), (5, 0), (0, 0)])
def test_empty_inputs_and_outputs_give_zero_gradients(op, shape, device):
    """(0, 13): x and y have no element, w has 13 whose gradient is zeros; (5, 0): five programs of masked lanes."""
    _check(op, lambda x, w: x * w, shape, device)


def test_a_launch_of_no_program_gives_zero_gradients(device):
    """No row: the kernel runs no program and y keeps its zeros; w's gradient is zeros (no backward launched)."""
    _check(row_sum, lambda x, w: (x * w).sum(0), (0, 13), device)


def test_some_rows_still_differentiate(device):
    _check(row_sum, lambda x, w: (x * w).sum(0), (7, 13), device)


@pytest.mark.parametrize(("example", "sizes"), [
    ("rmsnorm", ["0x4", "4x0"]),
    ("softmax", ["0x37", "6x0"]),
    ("rotary", ["2x3x5x0"]),
    ("flash_attention", ["2x0x12"]),
    ("matvec", ["37x0"]),
])
def test_examples_on_empty_tensors(example, sizes, capsys):
    assert cli.main(["check", example, "--sizes", *sizes, "--dtype", "float64"]) == 0, capsys.readouterr().out
