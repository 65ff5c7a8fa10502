"""A loop's state kept in the type the forward computed it in.

Kernels written for training declare their loop state float32 (`acc = tl.zeros(..., dtype=tl.float32)`); summing
float64 values into it, Triton's interpreter makes it float64 (Triton's promotion: a carried value takes the type
its updates give it). What keeps that state for the backward (a state tape, the kept finals of the op's
augmented forward) must keep float64, not the declared float32: rounded, the gradients were off by 1e-8, and a tape
sized for four bytes an element was overrun by eight (memory corruption). Checked in float64 against PyTorch
autograd on plain-PyTorch references, sizes that are not multiples of the block, NaN-poisoned outputs, through an
op (its augmented forward keeps the state) and through `tritongrad.grad` alone (the backward records it).
"""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad
from tritongrad.tools.testing import backward_launch

F64 = torch.float64
BLOCK = 16


@triton.jit
def l2_normalize_kernel(x_ptr, y_ptr, stride, n, BLOCK: tl.constexpr):
    """A user's first L2 normalize: the sum of squares in a float32 accumulator over the row's column blocks."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < n, other=0.0)
        acc += x * x
    norm = tl.sqrt(tl.sum(acc))
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < n, other=0.0)
        tl.store(y_ptr + row * stride + start + cols, x / norm, mask=start + cols < n)


@triton.jit
def logsumexp_kernel(x_ptr, y_ptr, stride, n, BLOCK: tl.constexpr):
    """An online max and sum declared float32."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = tl.zeros((), dtype=tl.float32) - float("inf")
    s = tl.zeros((), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + row * stride + start + cols, mask=start + cols < n, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    tl.store(y_ptr + row, m + tl.log(s))


@triton.jit
def welford_kernel(x_ptr, mean_ptr, var_ptr, stride, n, BLOCK: tl.constexpr):
    """Welford's mean and M2 declared float32, merged a block at a time (Chan's update): nonlinear state."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mean = tl.zeros((), dtype=tl.float32)
    m2 = tl.zeros((), dtype=tl.float32)
    count = tl.zeros((), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=0.0)
        block_count = tl.sum(mask.to(tl.float32))
        block_mean = tl.sum(x) / block_count
        block_m2 = tl.sum(tl.where(mask, (x - block_mean) * (x - block_mean), 0.0))
        total = count + block_count
        delta = block_mean - mean
        mean = mean + delta * block_count / total
        m2 = m2 + block_m2 + delta * delta * count * block_count / total
        count = total
    tl.store(mean_ptr + row, mean)
    tl.store(var_ptr + row, m2 / count)


@tritongrad.op
def l2_normalize(x):
    y = torch.full_like(x, float("nan"))
    l2_normalize_kernel[(x.shape[0],)](x, y, x.stride(0), x.shape[1], BLOCK=BLOCK)
    return y


@tritongrad.op
def logsumexp(x):
    y = torch.full((x.shape[0],), float("nan"), dtype=x.dtype, device=x.device)
    logsumexp_kernel[(x.shape[0],)](x, y, x.stride(0), x.shape[1], BLOCK=BLOCK)
    return y


@tritongrad.op
def welford(x):
    mean, var = (torch.full((x.shape[0],), float("nan"), dtype=x.dtype, device=x.device) for _ in range(2))
    welford_kernel[(x.shape[0],)](x, mean, var, x.stride(0), x.shape[1], BLOCK=BLOCK)
    return mean, var


CASES = {
    "l2 normalize": (l2_normalize, lambda x: x / x.norm(dim=1, keepdim=True)),
    "online logsumexp": (logsumexp, lambda x: torch.logsumexp(x, 1)),
    "welford": (welford, lambda x: (x.mean(1), x.var(1, unbiased=False))),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n", [45, 70])
def test_a_float32_declared_state_summing_float64_values_keeps_float64_through_an_op(case, n):
    op, reference = CASES[case]
    g = torch.Generator().manual_seed(50 + n)
    x = torch.randn(5, n, generator=g, dtype=F64).to(DEVICE).requires_grad_()
    outs, wants = op(x), reference(x)
    outs, wants = (outs, wants) if isinstance(outs, tuple) else ((outs,), (wants,))
    for out, want in zip(outs, wants, strict=True):
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    d_outs = [torch.randn(o.shape, generator=g, dtype=F64).to(DEVICE) for o in outs]
    (got,) = torch.autograd.grad(outs, x, d_outs)
    (expected,) = torch.autograd.grad(wants, x, d_outs)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.interpreter
def test_the_backward_alone_records_a_nonlinear_state_in_its_type():
    """`tritongrad.grad` on Welford's kernel: the backward recomputes the loop and keeps its state on a tape itself."""
    case, kernel, outputs = "welford", welford_kernel, ("mean_ptr", "var_ptr")
    g = torch.Generator().manual_seed(51)
    x = torch.randn(3, 45, generator=g, dtype=F64).to(DEVICE)
    _, reference = CASES[case]
    leaf = x.clone().requires_grad_()
    wants = reference(leaf)
    wants = wants if isinstance(wants, tuple) else (wants,)
    outs = [torch.full_like(w, float("nan")).detach() for w in wants]
    args = (x, *outs, x.stride(0), x.shape[1])
    kernel[(3,)](*args, BLOCK=BLOCK)
    d_outs = [torch.randn(w.shape, generator=g, dtype=F64).to(DEVICE) for w in wants]
    grads = backward_launch(kernel, (3,), args, {"BLOCK": BLOCK}, dict(zip(outputs, d_outs, strict=True)))
    (expected,) = torch.autograd.grad(wants, leaf, d_outs)
    torch.testing.assert_close(grads["x_ptr"], expected, rtol=1e-12, atol=1e-12)
