"""A fuzzed kernel (tests/fuzz/generate.py, seed 3302 kernel 572) and its PyTorch mirror.

The input loaded in the static loop gets a kernel of its own where the backward reads the loop's final
state from the forward (no recomputation of the loop beside it). The column indices the loop advances are reset in
the sweep, so the address the sums are stored at was computed inside the loop over the forward's programs and
read after it: a crash. Such an input keeps its other write strategy now (partial rows: the forward keeps nothing).
"""

# ruff: noqa: E501, B007

import torch
import triton
import triton.language as tl

from tritongrad.tools.testing import backward_launch, forward_keeping_state, poison

GRID = (2, 2)
SIZES = {"M": 16, "K": 6}
META = {"BM": 8, "BK": 4, "R0": 7}
OUTPUTS = {"y0_ptr": (16, 6), "y1_ptr": (16, 6)}
ZEROED = {"y0_ptr"}  # atomic outputs start at 0, others at NaN
TOL = 1e-09
SEED = 27078


@triton.jit
def kernel(x0_ptr, c1_ptr, y0_ptr, y1_ptr, M, K, BM: tl.constexpr, BK: tl.constexpr, R0: tl.constexpr):
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rm = pid_0 * BM + tl.arange(0, BM)
    mm = rm < M
    rk = pid_1 * BK + tl.arange(0, BK)
    mk = rk < K
    mask = mm[:, None] & mk[None, :]
    v0 = tl.load(x0_ptr + rm[:, None] * K + (rk - 1)[None, :], mask=mm[:, None] & (((rk - 1) >= 0) & ((rk - 1) < K))[None, :], other=-1.5)
    v1_acc = tl.zeros((BK, 4), dtype=tl.float64)
    v1_cols = tl.arange(0, 4)
    for v1_c in tl.static_range(0, R0, 4):
        v1_x = tl.load(c1_ptr + rk[:, None] * R0 + v1_cols[None, :], mask=mk[:, None] & (v1_cols[None, :] < R0), other=-1.5)
        v1_acc += tl.where(v1_cols[None, :] < R0, tl.sin(v1_x), 0.0)
        v1_cols += 4
    v1 = tl.sum(v1_acc, axis=1)
    tl.atomic_add(y0_ptr + rm[:, None] * K + rk[None, :], v1, mask=mask)
    tl.store(y1_ptr + rm[:, None] * K + rk[None, :], v0, mask=mask)


def mirror(x0, c1):
    """The kernel in PyTorch, program by program, on the valid elements."""
    y0 = torch.zeros((16, 6), dtype=torch.float64)
    y1 = torch.zeros((16, 6), dtype=torch.float64)
    for pid_0 in range(2):
        for pid_1 in range(2):
            m0 = pid_0 * 8
            m1 = min(m0 + 8, 16)
            sm = m1 - m0
            k0 = pid_1 * 4
            k1 = min(k0 + 4, 6)
            sk = k1 - k0
            u0 = torch.nn.functional.pad(x0, (2, 2), value=-1.5)[m0:m1, k0 + 1:k1 + 1]
            u1_acc = torch.zeros((sk,), dtype=torch.float64)
            for u1_i, u1_c in enumerate(range(0, 7, 4)):
                u1_x = c1[k0:k1, u1_c:min(u1_c + 4, 7)]
                u1_acc = u1_acc + (torch.sin(u1_x)).sum(1)
            u1 = u1_acc
            y0[m0:m1, k0:k1] = y0[m0:m1, k0:k1] + u1.expand(sm, sk)
            y1[m0:m1, k0:k1] = u0
    return {"y0_ptr": y0, "y1_ptr": y1}


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    return {
        "x0_ptr": torch.rand((16, 6), generator=g, dtype=torch.float64) * 4 - 2,
        "c1_ptr": torch.rand((6, 7), generator=g, dtype=torch.float64) * 4 - 2,
    }


def make_output_grads():
    g = torch.Generator().manual_seed(SEED + 1)
    return {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in OUTPUTS.items()}


def test_interchange_whose_stored_address_the_sweep_recomputes():
    inputs = make_inputs()
    outputs = {k: torch.zeros(s, dtype=torch.float64) if k in ZEROED else poison(torch.empty(s, dtype=torch.float64))
               for k, s in OUTPUTS.items()}
    kwargs = {**inputs, **outputs, **SIZES, **META}
    saved = forward_keeping_state(kernel, GRID, (), kwargs)  # (now none: the backward's best is persistent)
    if saved is None:
        kernel[GRID](**kwargs)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.is_floating_point()}
    want = mirror(*(leaves.get(k, v) for k, v in inputs.items()))
    for k, w in want.items():
        torch.testing.assert_close(outputs[k], w.detach(), rtol=TOL, atol=TOL)
    d_out = make_output_grads()
    got = backward_launch(kernel, GRID, (), kwargs, d_out, saved=saved)
    grads = torch.autograd.grad(list(want.values()), list(leaves.values()), [d_out[k] for k in want])
    for k, w in zip(leaves, grads, strict=True):
        torch.testing.assert_close(got[k], w, rtol=TOL, atol=TOL * max(1.0, w.abs().max().item()))
