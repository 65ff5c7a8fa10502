"""Fuzzer finding: per-program partial results accumulated with tl.atomic_add into one element.

Shrunk from `scripts/fuzz_campaign.py` (generate.py). Every program adds its block's maximum
into y0[0]; the gradient of each program's contribution is d_y0[0], well defined, and the derived
kernel computes it (checked with LaunchChecks.grid skipped), but the launch-time guard
refuses the grid as if the programs overwrote each other.
"""

import torch
import triton
import triton.language as tl

from tritongrad.tools.testing import backward_launch, poison

GRID = (2,)
SIZES = {"N": 31}
META = {"BN": 16}
OUTPUTS = {"y0_ptr": (1,)}
ZEROED = {"y0_ptr"}  # atomic outputs start at 0, others at NaN
TOL = 1e-09
SEED = 0


@triton.jit
def kernel(w0_ptr, y0_ptr, N, BN: tl.constexpr):
    pid_0 = tl.program_id(0)
    rn = pid_0 * BN + tl.arange(0, BN)
    mn = rn < N
    v0 = tl.load(w0_ptr + rn, mask=mn, other=0.0)
    v1 = tl.max(tl.where(mn, v0, -float('inf')))
    v2 = v1 + v1
    tl.atomic_add(y0_ptr, v2)


def mirror(w0):
    """The kernel in PyTorch, program by program, on the valid elements."""
    y0 = torch.zeros((1,), dtype=torch.float64)
    for pid_0 in range(2):
        n0 = pid_0 * 16
        n1 = min(n0 + 16, 31)
        u0 = w0[n0:n1]
        u1 = u0.amax(dim=(0,), keepdim=False)
        u2 = u1 + u1
        y0[0] = y0[0] + u2
    return {"y0_ptr": y0}


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    return {
        "w0_ptr": torch.rand((31,), generator=g, dtype=torch.float64) * 4 - 2,
    }


def make_output_grads():
    g = torch.Generator().manual_seed(SEED + 1)
    return {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in OUTPUTS.items()}


def test_atomic_add_across_programs():
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
