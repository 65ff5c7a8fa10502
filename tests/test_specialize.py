"""Derivation per constexpr specialization: a kernel written for several modes, each mode
selected by a ``tl.constexpr`` and storing its own way, is differentiated as the kernel of the mode
each launch runs, as Triton compiles it."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import backward_launch, poison

NONE, SUM, MEAN = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)  # globals a kernel reads are constexprs
BLOCK = 64


@triton.jit
def scaled_rows(x_ptr, w_ptr, out_ptr, N, stride, REDUCTION: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        x = x * w
    y = tl.exp(x) * x
    if REDUCTION == NONE:
        tl.store(out_ptr + row * stride + cols, y, mask=mask)
    if REDUCTION == SUM:
        tl.store(out_ptr + row, tl.sum(tl.where(mask, y, 0.0)))
    if REDUCTION == MEAN:
        tl.store(out_ptr + row, tl.sum(tl.where(mask, y, 0.0)) / N)


def reference(x, w, reduction, has_weight):
    x = x * w if has_weight else x
    y = torch.exp(x) * x
    return {NONE.value: y, SUM.value: y.sum(1), MEAN.value: y.mean(1)}[reduction]


@pytest.mark.parametrize("reduction", [NONE.value, SUM.value, MEAN.value])
@pytest.mark.parametrize("has_weight", [True, False])
def test_each_mode_is_differentiated_as_the_kernel_it_runs(reduction, has_weight):
    rows, n = 5, 45
    x = torch.randn(rows, n, dtype=torch.float64)
    w = torch.randn(n, dtype=torch.float64)
    shape = (rows, n) if reduction == NONE.value else (rows,)
    out = poison(torch.empty(shape, dtype=torch.float64))
    meta = {"REDUCTION": reduction, "HAS_WEIGHT": has_weight, "BLOCK": BLOCK}
    scaled_rows[(rows,)](x, w, out, n, x.stride(0), **meta)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    want = reference(*leaves, reduction, has_weight)
    torch.testing.assert_close(out, want.detach())
    d_out = torch.randn_like(out)
    wrt = ("x_ptr", "w_ptr") if has_weight else ("x_ptr",)
    got = backward_launch(scaled_rows, (rows,), (x, w, out, n, x.stride(0)), meta, {"out_ptr": d_out}, wrt=wrt)
    grads = torch.autograd.grad(want, leaves[:len(wrt)], d_out)
    for name, g in zip(wrt, grads, strict=True):
        torch.testing.assert_close(got[name], g, rtol=1e-10, atol=1e-10)


def test_a_specialization_sees_only_its_branch():
    bwd = tritongrad.grad(scaled_rows, constexprs={"REDUCTION": SUM.value, "HAS_WEIGHT": True})
    # the text is the point (one branch left): test_each_mode_is_differentiated_as_the_kernel_it_runs checks this
    # specialization's gradients
    assert "tl.sum" in bwd.src and "d_out_ptr + row * stride" not in bwd.src
    assert "w = tl.load(w_ptr + cols" in bwd.src and "if HAS_WEIGHT" not in bwd.src
    assert bwd.specialization == {"REDUCTION": SUM.value, "HAS_WEIGHT": True}  # BLOCK decides no branch


def test_the_generic_derivation_says_which_constexprs_to_give():
    with pytest.raises(NotDifferentiableError, match="a second tl.store") as e:
        tritongrad.grad(scaled_rows)
    assert "REDUCTION" in "".join(getattr(e.value, "__notes__", []))


@tritongrad.op
def scaled_rows_op(x, w, reduction: int):
    rows, n = x.shape
    out = torch.empty_like(x) if reduction == NONE.value else torch.empty(rows, dtype=x.dtype, device=x.device)
    scaled_rows[(rows,)](x, w, out, n, x.stride(0), REDUCTION=reduction, HAS_WEIGHT=True, BLOCK=BLOCK)
    return out


def test_an_op_called_in_several_modes_differentiates_each(device):
    x = torch.randn(5, 45, dtype=torch.float64, device=device)
    w = torch.randn(45, dtype=torch.float64, device=device)
    # one layout: the launch record's plan is shared, the derivation is not
    for reduction in (SUM.value, NONE.value, MEAN.value, SUM.value):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        refs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        out = scaled_rows_op(*leaves, reduction)
        want = reference(*refs, reduction, True)
        g = torch.randn_like(want)
        out.backward(g)
        want.backward(g)
        for got, ref in zip(leaves, refs, strict=True):
            torch.testing.assert_close(got.grad, ref.grad, rtol=1e-10, atol=1e-10)
