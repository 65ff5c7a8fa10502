"""`if` / `elif` / `else` on runtime values and on constexprs, against torch autograd.

Float64, sizes not powers of two, several programs taking different branches, NaN-poisoned
outputs, random upstream gradients.
"""

import re

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}
N, BLOCK = 83, 16
GRID = (triton.cdiv(N, BLOCK),)  # 6 programs


@triton.jit
def branchy(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + pid)  # one scale per program: programs take different branches
    if s > 0:
        y = x * s
        z = tl.exp(y)  # local to the branch
        out = z * x
    elif s < -1:
        out = tl.sin(x) * s
    else:
        out = x
    if SQUARE:  # constexpr: one branch exists after compilation
        out = out * out
    tl.store(y_ptr + offs, out, mask=mask)


def branchy_reference(x, s, square):
    ss = s.repeat_interleave(BLOCK)[: x.numel()]
    out = torch.where(ss > 0, torch.exp(x * ss) * x, torch.where(ss < -1, torch.sin(x) * ss, x))
    return out * out if square else out


def check(kernel, reference, x, s, meta, outputs="y_ptr"):
    y = poison(torch.empty_like(x))
    args = (x, s, y, x.numel())
    kernel[GRID](*args, **meta)
    xr, sr = x.clone().requires_grad_(), s.clone().requires_grad_()
    want = reference(xr, sr)
    torch.testing.assert_close(y, want.detach(), **TOL)
    dy = torch.randn_like(y)
    got = backward_launch(kernel, GRID, args, meta, {outputs: dy})
    want_x, want_s = torch.autograd.grad(want, (xr, sr), dy)
    torch.testing.assert_close(got["x_ptr"], want_x, **TOL)
    torch.testing.assert_close(got["s_ptr"], want_s, **TOL)


SCALES = [1.5, -2.0, 0.3, -0.5, -3.0, 0.7]  # each branch taken by some program


@pytest.mark.parametrize("square", [False, True])
def test_runtime_if_elif_else_on_a_loaded_scalar(square):
    x = torch.randn(N, dtype=DTYPE)
    s = torch.tensor(SCALES, dtype=DTYPE)
    check(branchy, lambda x, s: branchy_reference(x, s, square), x, s, {"BLOCK": BLOCK, "SQUARE": square})


def test_branch_reversal_reads_like_the_forward():
    src = tritongrad.grad(branchy).src
    # the text is the point (it reads like the forward): test_runtime_if_elif_else_on_a_loaded_scalar checks this
    # kernel's gradients
    assert len(re.findall(r"^ *if s > 0:$", src, flags=re.M)) == 2, src  # recomputed for `out`, then reversed
    assert "the branch taken recomputes its values" in src
    assert "z = tl.exp(y)" in src.split("# grad of: tl.store")[1], "the branch's own values are recomputed"
    assert "out_" not in src.split("# grad of")[0], "branches assign `out` itself, as the forward does"


@triton.jit
def one_sided(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + pid)
    if tl.sum(x) * s > 0:  # a test on differentiated values: the choice itself has no gradient
        x = x * s  # the other branch keeps x
    tl.store(y_ptr + offs, x * x, mask=mask)


def one_sided_reference(x, s):
    ss = s.repeat_interleave(BLOCK)[: x.numel()]
    sums = torch.nn.functional.pad(x, (0, BLOCK * GRID[0] - x.numel())).reshape(-1, BLOCK).sum(1)
    taken = (sums * s > 0).repeat_interleave(BLOCK)[: x.numel()]
    out = torch.where(taken, x * ss, x)
    return out * out


def test_variable_assigned_in_one_branch_keeps_its_value_in_the_other():
    x = torch.randn(N, dtype=DTYPE)
    s = torch.tensor(SCALES, dtype=DTYPE)
    check(one_sided, one_sided_reference, x, s, {"BLOCK": BLOCK})


@triton.jit
def _scale_or_shift(x, s, SCALE: tl.constexpr):
    if SCALE:
        r = x * s
    else:
        r = x + s
    return r


@triton.jit
def helper_branch(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + pid)
    tl.store(y_ptr + offs, _scale_or_shift(x, s, SCALE) * x, mask=mask)


@pytest.mark.parametrize("scale", [False, True])
def test_constexpr_if_in_an_inlined_helper(scale):
    x = torch.randn(N, dtype=DTYPE)
    s = torch.tensor(SCALES, dtype=DTYPE)

    def reference(x, s):
        ss = s.repeat_interleave(BLOCK)[: x.numel()]
        return (x * ss if scale else x + ss) * x

    check(helper_branch, reference, x, s, {"BLOCK": BLOCK, "SCALE": scale})


@triton.jit
def _stage(x, y_ptr, offs, mask, STAGE: tl.constexpr):
    if STAGE == 2:
        tl.store(y_ptr + offs, x * x, mask=mask)
    else:
        tl.atomic_max(y_ptr + offs, x, mask=mask)  # no gradient: derivable only where decided away


@triton.jit
def stage_computed_from_a_constexpr(x_ptr, y_ptr, N, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    _stage(tl.load(x_ptr + offs, mask=mask), y_ptr, offs, mask, 4 - MODE)  # the tutorial's `4 - STAGE`


def test_a_helpers_test_on_arithmetic_of_a_constexpr_is_decided():
    x, dy = torch.randn(N, dtype=DTYPE), torch.randn(N, dtype=DTYPE)
    args, meta = (x, poison(torch.empty_like(x)), N), {"BLOCK": BLOCK, "MODE": 2}
    stage_computed_from_a_constexpr[GRID](*args, **meta)
    torch.testing.assert_close(args[1], x * x, **TOL)
    got = backward_launch(stage_computed_from_a_constexpr, GRID, args, meta, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], 2 * x * dy, **TOL)
    with pytest.raises(NotDifferentiableError, match="atomic_max"):
        tritongrad.grad(stage_computed_from_a_constexpr, constexprs={"MODE": 1})


@triton.jit
def assigned_in_one_branch(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    s = tl.load(s_ptr + pid)
    if s > 0:
        t = x * s
    tl.store(y_ptr + offs, t)  # refused


def test_value_assigned_in_one_branch_of_a_runtime_if_is_refused_where_used():
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(assigned_in_one_branch)
    err = info.value
    assert err.source_line == "tl.store(y_ptr + offs, t)  # refused"
    assert "only one branch" in err.construct and err.hint


@triton.jit
def store_in_each_branch(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + pid)
    if s > 0:  # only one of the two stores runs in a program
        tl.store(y_ptr + offs, x * x, mask=mask)
    else:
        tl.store(y_ptr + offs, tl.exp(x), mask=mask)


def test_one_store_in_each_branch_is_accepted():
    n, block = 45, 16
    programs = triton.cdiv(n, block)
    x = torch.randn(n, dtype=torch.float64)
    s = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)[:programs]
    y = poison(torch.empty_like(x))
    args = (x, s, y, n)
    store_in_each_branch[(programs,)](*args, BLOCK=block)
    xr = x.clone().requires_grad_()
    positive = (s[torch.arange(n) // block] > 0)
    want = torch.where(positive, xr * xr, torch.exp(xr))
    torch.testing.assert_close(y, want.detach())
    dy = torch.randn_like(x)
    (want_grad,) = torch.autograd.grad(want, xr, dy)
    got = backward_launch(store_in_each_branch, (programs,), args, {"BLOCK": block}, {"y_ptr": dy}, wrt=("x_ptr",))
    torch.testing.assert_close(got["x_ptr"], want_grad)


@triton.jit
def _rows_summed(t):
    if len(t.shape) > 2:  # compile-time tests (as tg.unbroadcast's): a block's leading axis summed,
        t = tl.sum(t, 0)
    if len(t.shape) > 1:  # then a tile's rows, a row kept as it is (this test reads the `t` the first if merged)
        t = tl.sum(t, 1)
    return t


@triton.jit
def rank_branches(x_ptr, b_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    rows, cols = tl.arange(0, BM), tl.arange(0, BN)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
    b = tl.load(b_ptr + rows, mask=rows < M, other=0.0)
    y = _rows_summed(tl.sin(x)) * _rows_summed(tl.exp(b))  # the helper's `if` taken for x, not for b
    tl.store(y_ptr + rows, y, mask=rows < M)


@pytest.mark.compiled
def test_a_compile_time_test_on_a_shape_stays_in_the_if():
    """A helper's `if len(t.shape) > 1:` whose branches leave values of different shapes: the derived kernel keeps
    the test inline, so compiled Triton decides it when it compiles (hoisted as `gt = len(...) > 1; if gt:`, it was
    a runtime if whose branches' types differ, refused compiled; the interpreter ran it)."""
    @tritongrad.op
    def rows_times(x, b):
        y = torch.empty_like(b)
        rank_branches[(1,)](x, b, y, x.shape[0], x.shape[1], BM=8, BN=8)
        return y

    x = torch.randn(5, 7, dtype=DTYPE, requires_grad=True)
    b = torch.randn(5, dtype=DTYPE, requires_grad=True)
    g = torch.randn(5, dtype=DTYPE)
    y = rows_times(x, b)
    want = torch.sin(x).sum(1) * torch.exp(b)
    torch.testing.assert_close(y, want, **TOL)
    got = torch.autograd.grad(y, (x, b), g)
    for a, w in zip(got, torch.autograd.grad(want, (x, b), g), strict=True):
        torch.testing.assert_close(a, w, **TOL)
    assert "if len(" in tritongrad.grad(rank_branches).src


@triton.jit
def _exp_by_type(t):
    if t.dtype == tl.float32:  # compile-time: float32 by exp2, else tl.exp
        scaled = t * 1.4426950408889634  # a value of this branch alone
        e = tl.exp2(scaled)
    else:
        e = tl.exp(t)
    return e


@triton.jit
def exp_by_type(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, _exp_by_type(x) * x, mask=mask)


@pytest.mark.compiled
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_value_of_the_branch_a_compile_time_test_rules_out(dtype):
    """A dtype test decided when Triton compiles, whose branch not taken (float64 here) assigns a value of its own
    (`scaled`): its adjoint starts in the branch that assigns it, not before the `if` (`tg.zeros_grad` of a
    value that does not exist where the other branch is taken: refused compiled, UnboundLocalError interpreted).
    float32 takes the other branch."""
    tol = TOL if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    x = torch.randn(N, dtype=dtype)
    args, meta = (x, poison(torch.empty_like(x)), N), {"BLOCK": BLOCK}
    exp_by_type[GRID](*args, **meta)
    torch.testing.assert_close(args[1], torch.exp(x) * x, **tol)
    dy = torch.randn_like(x)
    got = backward_launch(exp_by_type, GRID, args, meta, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], torch.exp(x) * (x + 1) * dy, **tol)
    assert "if t.dtype == tl.float32:" in tritongrad.grad(exp_by_type).src


# -- conditional expressions: an `if` statement each (they were kept whole with no gradient: a silent zero) --------

@triton.jit
def _rows_or_self(t):
    return tl.sum(t, 1) if len(t.shape) > 1 else t  # compile-time test: a tile's rows summed, a vector kept


@triton.jit
def _exp_or_square(t, EXP: tl.constexpr):
    return tl.exp(t) if EXP else t * t


@triton.jit
def chosen_by_expressions(x_ptr, b_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr, EXP: tl.constexpr):
    rows, cols = tl.arange(0, BM), tl.arange(0, BN)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
    b = tl.load(b_ptr + rows, mask=rows < M, other=0.0)
    c = tl.sin(b) if EXP else tl.cos(b)  # in the kernel, on a constexpr
    y = _rows_or_self(tl.sin(x)) * _rows_or_self(c) + _exp_or_square(b, EXP)  # in helpers
    tl.store(y_ptr + rows, y, mask=rows < M)


@tritongrad.op
def chosen(x, b, exp: bool):
    y = torch.empty_like(b)
    chosen_by_expressions[(1,)](x, b, y, x.shape[0], x.shape[1], BM=8, BN=16, EXP=exp)
    return y


def chosen_reference(x, b, exp):
    return torch.sin(x).sum(1) * (torch.sin(b) if exp else torch.cos(b)) + (torch.exp(b) if exp else b * b)


@pytest.mark.compiled
@pytest.mark.parametrize("exp", [False, True])
def test_conditional_expressions_on_compile_time_tests(exp):
    """`a if test else b` whose test Triton decides when it compiles (a constexpr, a rank), in the kernel and in
    helpers: each an `if` statement, differentiated (kept whole, the chosen value had no gradient: d_x and d_b
    zero). Through tritongrad.grad (the backward kernel, without constexprs: the `if`s stay) and through an op."""
    m, n = 5, 11
    x, b = torch.randn(m, n, dtype=DTYPE), torch.randn(m, dtype=DTYPE)
    y, dy = poison(torch.empty(m, dtype=DTYPE)), torch.randn(m, dtype=DTYPE)
    args, meta = (x, b, y, m, n), {"BM": 8, "BN": 16, "EXP": exp}
    chosen_by_expressions[(1,)](*args, **meta)
    xr, br = x.clone().requires_grad_(), b.clone().requires_grad_()
    want = chosen_reference(xr, br, exp)
    torch.testing.assert_close(y, want.detach(), **TOL)
    want_x, want_b = torch.autograd.grad(want, (xr, br), dy)
    got = backward_launch(chosen_by_expressions, (1,), args, meta, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], want_x, **TOL)
    torch.testing.assert_close(got["b_ptr"], want_b, **TOL)
    src = tritongrad.grad(chosen_by_expressions).src
    assert "if EXP:" in src and "if len(" in src, src
    xo, bo = x.clone().requires_grad_(), b.clone().requires_grad_()
    for a, w in zip(torch.autograd.grad(chosen(xo, bo, exp), (xo, bo), dy), (want_x, want_b), strict=True):
        torch.testing.assert_close(a, w, **TOL)


@triton.jit
def chosen_at_runtime(x_ptr, s_ptr, y_ptr, t_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + pid)  # one per program: programs take different branches
    t = s * s if s > 0 else tl.exp(s) * 0.5  # a scalar chosen by a runtime test
    tl.store(t_ptr + pid, t)
    y = x * t if s < -1 else tl.sin(x) * s + (s * s if s > 0 else s)  # tiles, one nested in an operand
    tl.store(y_ptr + offs, y, mask=mask)


def chosen_at_runtime_reference(x, s):
    t = torch.where(s > 0, s * s, torch.exp(s) * 0.5)
    ss, tt = s.repeat_interleave(BLOCK)[: x.numel()], t.repeat_interleave(BLOCK)[: x.numel()]
    y = torch.where(ss < -1, x * tt, torch.sin(x) * ss + torch.where(ss > 0, ss * ss, ss))
    return y, t


@tritongrad.op
def chosen_by_runtime_tests(x, s):
    y, t = torch.empty_like(x), torch.empty_like(s)
    chosen_at_runtime[(s.numel(),)](x, s, y, t, x.numel(), BLOCK=BLOCK)
    return y, t


def test_conditional_expressions_on_runtime_tests():
    """`a if s > 0 else b` on a loaded scalar, choosing scalars and tiles: a runtime `if` statement each (as compiled
    Triton makes of one: its branches give one type), whose branches are differentiated (kept whole: no gradient)."""
    x = torch.randn(N, dtype=DTYPE)
    s = torch.tensor(SCALES, dtype=DTYPE)
    y, t = poison(torch.empty_like(x)), poison(torch.empty_like(s))
    args = (x, s, y, t, N)
    chosen_at_runtime[GRID](*args, BLOCK=BLOCK)
    xr, sr = x.clone().requires_grad_(), s.clone().requires_grad_()
    want = chosen_at_runtime_reference(xr, sr)
    torch.testing.assert_close(y, want[0].detach(), **TOL)
    torch.testing.assert_close(t, want[1].detach(), **TOL)
    dy, dt = torch.randn_like(x), torch.randn_like(s)
    want_x, want_s = torch.autograd.grad(want, (xr, sr), (dy, dt))
    got = backward_launch(chosen_at_runtime, GRID, args, {"BLOCK": BLOCK}, {"y_ptr": dy, "t_ptr": dt})
    torch.testing.assert_close(got["x_ptr"], want_x, **TOL)
    torch.testing.assert_close(got["s_ptr"], want_s, **TOL)
    xo, so = x.clone().requires_grad_(), s.clone().requires_grad_()
    for a, w in zip(torch.autograd.grad(chosen_by_runtime_tests(xo, so), (xo, so), (dy, dt)), (want_x, want_s),
                    strict=True):
        torch.testing.assert_close(a, w, **TOL)


@triton.jit
def choose_between_tuples(x_ptr, y_ptr, N, BLOCK: tl.constexpr, SWAP: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    a, b = (x, x * x) if SWAP else (x * x, x)
    tl.store(y_ptr + offs, a - b)


@triton.jit
def and_of_values(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    a = tl.load(x_ptr)
    b = tl.load(x_ptr + 1)
    tl.store(y_ptr, a and b)  # the interpreter gives one of them, compiled Triton a boolean


@pytest.mark.parametrize("kernel, construct, line", [
    (choose_between_tuples, "choosing between tuples", "a, b = (x, x * x) if SWAP else (x * x, x)"),
    (and_of_values, "`and` / `or` of differentiated values", "tl.store(y_ptr, a and b)")], ids=["tuples", "and"])
def test_choices_without_a_rule_are_refused(kernel, construct, line):
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(kernel)
    assert construct in info.value.construct and info.value.hint
    assert info.value.source_line.startswith(line)


@triton.jit
def later_branch_reads(x_ptr, y_ptr, N, R, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    SCALED: tl.constexpr = MODE == "scaled"  # a local constexpr: the ifs stay, Triton decides them when it compiles
    if SCALED:
        t = x * x  # bound only where SCALED
    y = tl.sin(x)
    if SCALED:
        y = y * t  # read after its if, inside a later if on the same test
    if MODE == "looped":
        for i in range(R):  # a loop inside the later branch: its adjoint starts before the loop, in the branch
            y += tl.exp(x * i) * 0.25
    tl.store(y_ptr + offs, y, mask=mask)


@pytest.mark.compiled
@pytest.mark.parametrize("mode", ["scaled", "plain", "looped"])
def test_a_value_bound_in_a_constexpr_branch_read_in_a_later_one(mode):
    """A value a constexpr `if` assigns in one branch (`t`), read inside a later `if` on the same test: its adjoint
    starts inside the later branch, not before that if (`d_t = tg.zeros_grad(t)` there read `t` where the branch
    is not taken: UnboundLocalError interpreted, an undefined name compiled). Each constexpr value in float64."""
    R = 3
    x = torch.randn(N, dtype=DTYPE)
    args, meta = (x, poison(torch.empty_like(x)), N, R), {"BLOCK": BLOCK, "MODE": mode}
    later_branch_reads[GRID](*args, **meta)
    xr = x.clone().requires_grad_()
    want = torch.sin(xr) * (xr * xr if mode == "scaled" else 1)
    if mode == "looped":
        want = want + sum(torch.exp(xr * i) * 0.25 for i in range(R))
    torch.testing.assert_close(args[1], want.detach(), **TOL)
    dy = torch.randn_like(x)
    got = backward_launch(later_branch_reads, GRID, args, meta, {"y_ptr": dy})
    (want_x,) = torch.autograd.grad(want, xr, dy)
    torch.testing.assert_close(got["x_ptr"], want_x, **TOL)
