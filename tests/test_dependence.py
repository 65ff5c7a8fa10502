"""analysis/dependence.py: the parameters what a kernel stores through some pointers is computed from (values,
addresses, masks, the branches and loops around the stores, and memory a load reads after a store), which decides
where a launch made again for a double backward (host/remake.py) may take a stand-in for a tensor the op did not
keep."""

import triton
import triton.language as tl

from tritongrad.analysis.dependence import stored_from
from tritongrad.examples import layernorm
from tritongrad.frontend.normalize import normalize_kernel


def test_a_layer_norms_statistics_are_not_computed_from_its_weight_and_bias():
    program = normalize_kernel(layernorm.layernorm_kernel, {"BLOCK": 16, "COMPUTE": tl.float64})
    params = stored_from(program, ["mean_ptr", "rstd_ptr"])
    assert "x_ptr" in params and not {"w_ptr", "b_ptr", "y_ptr"} & params
    assert {"x_ptr", "w_ptr", "b_ptr"} <= stored_from(program, ["y_ptr"])


@triton.jit
def _guarded(x_ptr, b_ptr, s_ptr, t_ptr, u_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    total = tl.sum(x, axis=0)
    if tl.load(b_ptr) > 0:  # only a condition: no gradient flows from b, but the stored value depends on it
        total = total * 2
    tl.store(s_ptr, total)
    for i in range(0, tl.load(b_ptr + 1).to(tl.int32)):  # a loop bound
        tl.store(t_ptr + i, x)
    tl.store(u_ptr + offs, x, mask=offs < n)
    tl.store(u_ptr + offs + BLOCK, tl.load(b_ptr + offs))
    tl.store(x_ptr + BLOCK + offs, tl.load(u_ptr + offs + BLOCK))  # through memory: what u's store wrote


def test_conditions_loop_bounds_and_memory_count():
    program = normalize_kernel(_guarded, {"BLOCK": 16})
    assert "b_ptr" in stored_from(program, ["s_ptr"])
    assert "b_ptr" in stored_from(program, ["t_ptr"])
    assert stored_from(program, ["s_ptr"]) >= {"x_ptr", "n"}
    assert "b_ptr" in stored_from(program, ["x_ptr"])
