"""Hostile inputs (issue 5): each ends in a clear error or a correct gradient, never a wrong one.

Refusals that are one construct each live in test_refusals.py (a second store to an output,
a load of a stored output, scatter stores, atomic_max, inline calls without rules, sources
that cannot be found); the cases here need a run to show what happens.
"""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.testing import backward_launch, poison


@triton.jit
def loop_to_a_loaded_count(x_ptr, n_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    steps = tl.load(n_ptr + tl.program_id(0))
    x = tl.load(x_ptr + tl.program_id(0) * BLOCK + offs)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for _ in range(steps):  # the trip count is data: the backward replays the same load
        acc += tl.sin(x)
    tl.store(y_ptr + tl.program_id(0) * BLOCK + offs, acc)


def test_trip_count_from_loaded_data_gives_the_right_gradient():
    counts = torch.tensor([3, 0, 5], dtype=torch.int32)
    x = torch.randn(3, 16, dtype=torch.float64)
    y = poison(torch.empty_like(x))
    loop_to_a_loaded_count[(3,)](x, counts, y, BLOCK=16)
    xs = x.clone().requires_grad_()
    want = torch.sin(xs) * counts[:, None].double()
    torch.testing.assert_close(y, want.detach())
    dy = torch.randn_like(x)
    got = backward_launch(loop_to_a_loaded_count, (3,), (x, counts, y), {"BLOCK": 16}, {"y_ptr": dy})
    assert tritongrad.grad(loop_to_a_loaded_count).wrt == ("x_ptr",)  # the count holds no gradient
    torch.testing.assert_close(got["x_ptr"], torch.autograd.grad(want, xs, dy)[0])


@triton.jit
def scale_rows(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0)
    s = tl.load(s_ptr + row)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + row * N + offs, x * s, mask=offs < N)


def test_integer_tensor_in_wrt_is_named():
    x = torch.randn(2, 5, dtype=torch.float64)
    s = torch.tensor([2, 3], dtype=torch.int32)
    y = torch.empty_like(x)
    with pytest.raises(TypeError, match="wrt names `s_ptr`, but the tensor passed there is torch.int32"):
        backward_launch(scale_rows, (2,), (x, s, y, 5), {"BLOCK": 8}, {"y_ptr": torch.randn_like(x)},
                        wrt=("x_ptr", "s_ptr"))


@triton.jit
def dropout(x_ptr, y_ptr, n, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    keep = tl.rand(seed, offs) > p  # regenerated identically when the backward replays the forward
    tl.store(y_ptr + offs, tl.where(keep, x / (1 - p), 0.0), mask=mask)


def test_dropout_mask_is_regenerated_identically():
    n, p, seed = 300, 0.3, 1234
    x = torch.randn(n, dtype=torch.float64).abs() + 0.1  # nonzero, so a dropped element shows as 0
    y = poison(torch.empty_like(x))
    grid = (triton.cdiv(n, 64),)
    dropout[grid](x, y, n, p, seed, BLOCK=64)
    kept = y != 0
    assert 0 < kept.sum() < n
    dy = torch.randn_like(x)
    got = backward_launch(dropout, grid, (x, y, n, p, seed), {"BLOCK": 64}, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], torch.where(kept, dy / (1 - p), 0.0))


@triton.jit
def reads_back_its_output(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 2.0)
    z = tl.load(y_ptr + offs)  # what it stored: the backward could not tell the two apart
    tl.store(y_ptr + BLOCK + offs, z)


def test_reading_an_output_after_storing_it_is_refused():
    with pytest.raises(NotDifferentiableError, match="also stores to"):
        tritongrad.grad(reads_back_its_output)


@triton.jit
def inline_asm(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise("mov.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y)


def test_inline_assembly_is_refused():
    with pytest.raises(NotDifferentiableError, match="inline_asm_elementwise"):
        tritongrad.grad(inline_asm)


def test_op_with_mismatched_devices_is_named():
    if not torch.cuda.is_available():
        pytest.skip("needs a second device type")
    from tritongrad.examples.swiglu import swiglu

    op = tritongrad.op(swiglu)
    a = torch.randn(100, device="cuda", requires_grad=True)
    b = torch.randn(100, device="cpu", requires_grad=True)
    with pytest.raises(Exception, match="CPU tensor|device"):
        op(a, b)
