"""A fuzzed kernel (tests/fuzz/generate.py, seed 3303 kernel 474) and its PyTorch mirror.

The input loaded in the loop gets a kernel of its own reading the loop's final state from the forward, and
the adjoint its iterations read (d_v2_h, computed from d_v3 = dy1 + ...) is computed by a prologue. The
main kernel kept `d_v3 += ...` after dropping `d_v3 = ...` as unused: a crash (unbound name); dropping
both, the sums the kernel stores were dropped too while the fix was made (zero gradient, caught here).
h3 multiplies (the shrunk kernel subtracted): so the backward reads the loop's final state, which a difference
needs only for its shape, no longer recomputed for that."""

# ruff: noqa: E501, B007

import torch
import triton
import triton.language as tl

from tritongrad.tools.testing import backward_launch, forward_keeping_state, poison

GRID = (3,)
SIZES = {"M": 6, "K": 2, "T0": 3}
META = {"BM": 2, "BK": 4}
OUTPUTS = {"y0_ptr": (6, 2), "y1_ptr": (6, 2)}
ZEROED = {"y0_ptr"}  # atomic outputs start at 0, others at NaN
TOL = 1e-09
SEED = 45927


@triton.jit
def h1(a0, a1):
    return tl.minimum(a0, a1), a0


@triton.jit
def h3(a0, a1):
    return a0 * a1


@triton.jit
def kernel(x0_ptr, z1_ptr, y0_ptr, y1_ptr, M, K, T0, BM: tl.constexpr, BK: tl.constexpr):
    pid_0 = tl.program_id(0)
    rm = pid_0 * BM + tl.arange(0, BM)
    mm = rm < M
    rk = tl.arange(0, BK)
    mk = rk < K
    mask = mm[:, None] & mk[None, :]
    v0_base = x0_ptr
    v0_base += 1
    v0 = tl.load(v0_base + rm[:, None] * K + rk[None, :] - 1, mask=mask, other=1.0)
    v1, v1_1 = h1(v0, v0)
    v2_h = tl.zeros((BM, BK), dtype=tl.float64)
    for v2_t in range(0, T0, 2):
        v2_x = tl.load(z1_ptr + v2_t * K + rk, mask=mk, other=-1.5)
        v2_f = tl.sum(tl.where(mk, tl.sigmoid(v2_x), 0.0), axis=0, keep_dims=True)
        v2_h -= v2_f
    v2 = v2_h
    v3 = h3(v0, v2)
    v4_x = tl.where(mk[None, :], v1, -float('inf'))
    v4_m = tl.max(v4_x, axis=1, keep_dims=True)
    v4_z = v4_x - v4_m
    v4_e = tl.exp(v4_z)
    v4_s = tl.sum(v4_e, axis=1, keep_dims=True)
    v4 = v4_e / v4_s
    v5 = v3 + v4
    tl.atomic_add(y0_ptr + rm[:, None] * K + rk[None, :], v5, mask=mask)
    tl.store(y1_ptr + rm[:, None] * K + rk[None, :], v3, mask=mask)


def mirror(x0, z1):
    """The kernel in PyTorch, program by program, on the valid elements."""
    y0 = torch.zeros((6, 2), dtype=torch.float64)
    y1 = torch.zeros((6, 2), dtype=torch.float64)
    for pid_0 in range(3):
        m0 = pid_0 * 2
        m1 = min(m0 + 2, 6)
        sm = m1 - m0
        k0, k1 = 0, 2
        sk = k1 - k0
        u0 = x0[m0:m1, k0:k1]
        u1 = torch.minimum(u0, u0)
        u2_h = torch.zeros((sm, sk), dtype=torch.float64)
        for u2_i, u2_t in enumerate(range(0, 3, 2)):
            u2_x = z1[u2_t, k0:k1]
            u2_f = (torch.sigmoid(u2_x)).sum(dim=(0,), keepdim=True)
            u2_h = u2_h - u2_f
        u2 = u2_h
        u3 = u0 * u2
        u4 = torch.softmax(u1, dim=1)
        u5 = u3 + u4
        y0[m0:m1, k0:k1] = y0[m0:m1, k0:k1] + u5
        y1[m0:m1, k0:k1] = u3
    return {"y0_ptr": y0, "y1_ptr": y1}


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    return {
        "x0_ptr": torch.rand((6, 2), generator=g, dtype=torch.float64) * 4 - 2,
        "z1_ptr": torch.rand((3, 2), generator=g, dtype=torch.float64) * 4 - 2,
    }


def make_output_grads():
    g = torch.Generator().manual_seed(SEED + 1)
    return {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in OUTPUTS.items()}


def test_prologue_of_an_interchange_reading_kept_finals():
    inputs = make_inputs()
    outputs = {k: torch.zeros(s, dtype=torch.float64) if k in ZEROED else poison(torch.empty(s, dtype=torch.float64))
               for k, s in OUTPUTS.items()}
    kwargs = {**inputs, **outputs, **SIZES, **META}
    saved = forward_keeping_state(kernel, GRID, (), kwargs)
    assert saved is not None  # the forward kept the loop's final state
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.is_floating_point()}
    want = mirror(*(leaves.get(k, v) for k, v in inputs.items()))
    for k, w in want.items():
        torch.testing.assert_close(outputs[k], w.detach(), rtol=TOL, atol=TOL)
    d_out = make_output_grads()
    grads = torch.autograd.grad(list(want.values()), list(leaves.values()), [d_out[k] for k in want])
    for kept in (saved, None):
        got = backward_launch(kernel, GRID, (), kwargs, d_out, saved=kept)
        for k, w in zip(leaves, grads, strict=True):
            torch.testing.assert_close(got[k], w, rtol=TOL, atol=TOL * max(1.0, w.abs().max().item()))
