"""A fuzzed kernel (tests/fuzz/generate.py, seed 2050 kernel 423, shrunk) and its PyTorch mirror.

The input loaded in the loop gets a kernel of its own (interchange); its adjoint is accumulated under a
branch of the loop body. The persistent loop hoisted the adjoint's zero start and what follows it out of
the loop, taking the name for one assigned once (the assignment inside the branch was not counted): a
silent zero gradient."""

# ruff: noqa: E501

import torch
import triton
import triton.language as tl

from tritongrad.tools.testing import backward_launch, poison

GRID = (2,)
SIZES = {"N": 31}
META = {"BN": 16}
OUTPUTS = {"y0_ptr": (2,), "y1_ptr": (31,)}
ZEROED = {}  # atomic outputs start at 0, others at NaN
TOL = 1e-09
SEED = 0


@triton.jit
def kernel(w0_ptr, z1_ptr, y0_ptr, y1_ptr, N, BN: tl.constexpr):
    pid_0 = tl.program_id(0)
    rn = pid_0 * BN + tl.arange(0, BN)
    mn = rn < N
    v0 = tl.load(w0_ptr + rn, mask=mn, other=0.0)
    v1_h = tl.zeros((), dtype=tl.float64)
    for v1_t in range(1):
        v1_x = tl.load(z1_ptr + v1_t)
        v1_f = v1_x
        if v1_t % 2 == 0:
            v1_h += v1_f
        else:
            v1_h = v1_h - 2.0 * v1_f
    v1 = v1_h
    tl.store(y0_ptr + pid_0, v1)
    tl.store(y1_ptr + rn, v0, mask=mn)


def mirror(w0, z1):
    """The kernel in PyTorch, program by program, on the valid elements."""
    y0 = torch.zeros((2,), dtype=torch.float64)
    y1 = torch.zeros((31,), dtype=torch.float64)
    for pid_0 in range(2):
        n0 = pid_0 * 16
        n1 = min(n0 + 16, 31)
        u0 = w0[n0:n1]
        u1_h = torch.zeros((), dtype=torch.float64)
        for u1_t in range(1):
            u1_x = z1[u1_t]
            u1_f = u1_x
            if u1_t % 2 == 0:
                u1_h = u1_h + u1_f
            else:
                u1_h = u1_h - 2.0 * u1_f
        u1 = u1_h
        y0[pid_0] = u1
        y1[n0:n1] = u0
    return {"y0_ptr": y0, "y1_ptr": y1}


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    return {
        "w0_ptr": torch.rand((31,), generator=g, dtype=torch.float64) * 4 - 2,
        "z1_ptr": torch.rand((1,), generator=g, dtype=torch.float64) * 4 - 2,
    }


def make_output_grads():
    g = torch.Generator().manual_seed(SEED + 1)
    return {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in OUTPUTS.items()}


def test_interchanged_input_accumulated_under_a_branch():
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
