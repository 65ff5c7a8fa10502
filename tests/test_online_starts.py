"""Online softmax loops whose sums do not start at zero (online.py's scaled starts).

Triton's attention tutorial starts its row sum at 1 (`l_i = zeros + 1.0`, with the max at -inf: the one is
scaled away by the first block), and its causal form runs two loops in a row, the second starting from the
first's max and sums. Each loop is still rewritten as a max pass and plain sums, the start scaled to the final
max (`s0 * exp(m0 - M)`; kept as it is where no block was seen, as the forward keeps it). Checked in float64
against torch.logsumexp and autograd, on lengths that are not multiples of the block, empty rows included, with
NaN-poisoned outputs; the derived source must say the loop was rewritten.
"""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad

F64 = torch.float64
REWRITTEN = "only stabilizes"  # online.py's note over the rewritten loop's reversal


@triton.jit
def lse_from_one_kernel(x_ptr, n_ptr, y_ptr, stride, BLOCK: tl.constexpr):
    """The tutorial's convention: the max starts at -inf, the sum at one."""
    row = tl.program_id(0)
    n = tl.load(n_ptr + row)
    cols = tl.arange(0, BLOCK)
    m = tl.zeros((), dtype=tl.float64) - float("inf")
    s = tl.zeros((), dtype=tl.float64) + 1.0
    for t in range(0, n, BLOCK):
        x = tl.load(x_ptr + row * stride + t + cols, mask=t + cols < n, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    tl.store(y_ptr + row, m + tl.log(s))


@triton.jit
def _lse_stage(m, s, x_ptr, lo, hi, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for t in range(lo, hi, BLOCK):
        x = tl.load(x_ptr + t + cols, mask=t + cols < hi, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        alpha = tl.exp2(m - m_new)
        s = s * alpha + tl.sum(tl.exp2(x - m_new))
        m = m_new
    return m, s


@triton.jit
def lse_in_two_stages_kernel(x_ptr, b_ptr, y_ptr, T, SPLIT, BLOCK: tl.constexpr):
    """log2(2^b + sum 2^x) over a row: the max starts at the loaded b (sum one), a first loop over
    [0, SPLIT), a second over [SPLIT, T) starting from the first's max and sum."""
    row = tl.program_id(0)
    m = tl.load(b_ptr + row)
    s = tl.zeros((), dtype=tl.float64) + 1.0
    m, s = _lse_stage(m, s, x_ptr + row * T, 0, SPLIT, BLOCK)
    m, s = _lse_stage(m, s, x_ptr + row * T, SPLIT, T, BLOCK)
    tl.store(y_ptr + row, m + tl.log2(s))


@tritongrad.op
def lse_from_one(x, n):
    y = torch.full((x.shape[0],), float("nan"), dtype=x.dtype, device=x.device)
    lse_from_one_kernel[(x.shape[0],)](x, n, y, x.stride(0), BLOCK=16)
    return y


@tritongrad.op
def lse_in_two_stages(x, b, split: int):
    y = torch.full((x.shape[0],), float("nan"), dtype=x.dtype, device=x.device)
    lse_in_two_stages_kernel[(x.shape[0],)](x, b, y, x.shape[1], split, BLOCK=16)
    return y


def _check(out, want, leaves, twins):
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    g = torch.randn(out.shape, dtype=F64, device=out.device)
    got = torch.autograd.grad(out, leaves, g)
    expected = torch.autograd.grad(want, twins, g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_sum_starting_at_one_is_rewritten_and_gets_logsumexps_gradient():
    torch.manual_seed(40)
    x = torch.randn(4, 45, dtype=F64, device=DEVICE)
    n = torch.tensor([45, 17, 0, 33], device=DEVICE)  # row 2 empty: no block seen, the forward keeps s = 1
    leaf, twin = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = torch.stack([torch.logsumexp(twin[i, :k], 0) for i, k in enumerate(n.tolist())])
    _check(lse_from_one(leaf, n), want, (leaf,), (twin,))
    assert REWRITTEN in tritongrad.grad(lse_from_one_kernel, wrt=("x_ptr",), outputs=("y_ptr",)).src


@pytest.mark.parametrize("split", [0, 19, 45])  # an empty first stage, both, an empty second
def test_two_online_loops_in_a_row_are_both_rewritten(split):
    torch.manual_seed(41 + split)
    x = torch.randn(3, 45, dtype=F64, device=DEVICE)
    b = torch.randn(3, dtype=F64, device=DEVICE) * 3
    leaves = [t.clone().requires_grad_() for t in (x, b)]
    twins = [t.clone().requires_grad_() for t in (x, b)]
    want = torch.logsumexp(torch.cat([twins[1][:, None], twins[0]], 1) * torch.log(torch.tensor(2.0, dtype=F64)),
                           1) / torch.log(torch.tensor(2.0, dtype=F64))
    _check(lse_in_two_stages(*leaves, split), want, leaves, twins)
    src = tritongrad.grad(lse_in_two_stages_kernel, wrt=("x_ptr", "b_ptr"), outputs=("y_ptr",)).src
    assert src.count(REWRITTEN) == 2
