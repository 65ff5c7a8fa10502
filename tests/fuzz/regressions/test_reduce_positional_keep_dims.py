"""Fuzzer finding: ``tl.reduce(x, axis, combine_fn, True)``, keep_dims passed by position.

The frontend turns a ``tl.reduce`` whose combine function is a sum / max / min into
``tl.sum`` / ``tl.max`` / ``tl.min`` with ``args[:2]`` and a ``keep_dims=`` keyword only: a
positional ``keep_dims`` is dropped, and the derived kernel differentiates a reduction
without the kept axis. With a max (the kernel below, shrunk by the fuzzer from
tests/fuzz/generate.py) the gradient is silently wrong; with a sum (``test_sum_crashes``)
the backward crashes (rank mismatch in ``tg.sum_grad``). Spelled ``keep_dims=True``, both
are right. (With ``axis=`` and ``combine_fn=`` as keywords the reduction is refused as
"not a sum, max or min", and shape inference can raise ZeroDivisionError on the wrongly
scalar result of ``tl.reduce(x, None, f, True)``.)
"""

# ruff: noqa: E501

import torch
import triton
import triton.language as tl

from tritongrad.tools.testing import backward_launch, poison

GRID = (2, 2)
SIZES = {"M": 15, "K": 31}
META = {"BM": 8, "BK": 16}
OUTPUTS = {"y0_ptr": (2, 1, 15)}
ZEROED = {}  # atomic outputs start at 0, others at NaN
TOL = 1e-09
SEED = 0


@triton.jit
def _fuzz_max(a, b):
    return tl.maximum(a, b)


@triton.jit
def kernel(x0_ptr, y0_ptr, M, K, BM: tl.constexpr, BK: tl.constexpr):
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rm = pid_0 * BM + tl.arange(0, BM)
    mm = rm < M
    rk = pid_1 * BK + tl.arange(0, BK)
    mk = rk < K
    mask = mm[:, None] & mk[None, :]
    v0 = tl.load(x0_ptr + rm[:, None] * K + rk[None, :], mask=mask, other=0.0)
    v3 = tl.trans(v0)
    v4 = tl.reduce(tl.where(mk[:, None], v3, -float('inf')), 0, _fuzz_max, True)
    tl.store(y0_ptr + pid_1 * M + rm[None, :], v4, mask=mm[None, :])


def mirror(x0):
    """The kernel in PyTorch, program by program, on the valid elements."""
    y0 = torch.zeros((2, 1, 15), dtype=torch.float64)
    for pid_0 in range(2):
        for pid_1 in range(2):
            m0 = pid_0 * 8
            m1 = min(m0 + 8, 15)
            k0 = pid_1 * 16
            k1 = min(k0 + 16, 31)
            u0 = x0[m0:m1, k0:k1]
            u3 = u0.T
            u4 = u3.amax(dim=(0,), keepdim=True)
            y0[pid_1, 0:1, m0:m1] = u4
    return {"y0_ptr": y0}


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    return {
        "x0_ptr": torch.randint(-4, 5, (15, 31), generator=g).to(torch.float64) / 2,
    }


def make_output_grads():
    g = torch.Generator().manual_seed(SEED + 1)
    return {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in OUTPUTS.items()}


def test_max_wrong_gradient():
    inputs = make_inputs()
    outputs = {k: torch.zeros(s, dtype=torch.float64) if k in ZEROED else poison(torch.empty(s, dtype=torch.float64))
               for k, s in OUTPUTS.items()}
    kwargs = {**inputs, **outputs, **SIZES, **META}
    kernel[GRID](**kwargs)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.is_floating_point()}
    want = mirror(*(leaves.get(k, v) for k, v in inputs.items()))
    for k, w in want.items():
        torch.testing.assert_close(outputs[k], w.detach(), rtol=TOL, atol=TOL)
    d_out = make_output_grads()
    got = backward_launch(kernel, GRID, (), kwargs, d_out)
    grads = torch.autograd.grad(list(want.values()), list(leaves.values()), [d_out[k] for k in want],
                                allow_unused=True)
    for k, w in zip(leaves, grads, strict=True):
        w = torch.zeros_like(inputs[k]) if w is None else w
        torch.testing.assert_close(got[k], w, rtol=TOL, atol=TOL * max(1.0, w.abs().max().item()))


@triton.jit
def _sum(a, b):
    return a + b


@triton.jit
def row_sums(x_ptr, y_ptr, M, K, BM: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    r = tl.reduce(x, 1, _sum, True)  # (BM, 1)
    tl.store(y_ptr + rm[:, None], r, mask=rm[:, None] < M)


def test_sum_crashes():
    x = torch.randn(7, 13, dtype=torch.float64)
    y = poison(torch.empty(7, 1, dtype=torch.float64))
    row_sums[(1,)](x, y, 7, 13, BM=8, BK=16)
    xs = x.clone().requires_grad_()
    want = xs.sum(1, keepdim=True)
    torch.testing.assert_close(y, want.detach(), rtol=TOL, atol=TOL)
    dy = torch.randn(7, 1, dtype=torch.float64)
    got = backward_launch(row_sums, (1,), (x, y, 7, 13), {"BM": 8, "BK": 16}, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], torch.autograd.grad(want, xs, dy)[0], rtol=TOL, atol=TOL)
