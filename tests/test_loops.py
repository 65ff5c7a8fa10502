"""`for` loops: stateless bodies, linear accumulators, index and pointer state, nesting.

Each kernel against a plain-PyTorch reference and torch autograd: float64, sizes not powers
of two (partial last tiles), several programs, NaN-poisoned outputs, random upstream gradients.
"""

import math
import re

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


def assert_grads(kernel, grid, args, meta, out, want, leaves, names, d_out=None):
    """Forward output against the reference, then the derived gradients against autograd's."""
    torch.testing.assert_close(out, want.detach(), **TOL)
    assert_gradients_match(kernel, grid, args, meta, out, want, leaves, names, d_out=d_out)


# -- LayerNorm: a mean loop, a variance loop, a normalize-and-store loop -------------------------


@triton.jit
def layer_norm_fwd(X, Y, W, B, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    _mean = tl.zeros([BLOCK_SIZE], dtype=X.dtype.element_ty)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        a = tl.load(X + cols, mask=cols < N, other=0.0)
        _mean += a
    mean = tl.sum(_mean, axis=0) / N
    _var = tl.zeros([BLOCK_SIZE], dtype=X.dtype.element_ty)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0)
        x = tl.where(cols < N, x - mean, 0.0)
        _var += x * x
    var = tl.sum(_var, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.0)
        x_hat = (x - mean) * rstd
        y = x_hat * w + b
        tl.store(Y + cols, y, mask=mask)


def test_layer_norm_three_loops():
    rows, block = 5, 16
    n = 3 * block + 5
    x, w, b = torch.randn(rows, n, dtype=DTYPE), torch.randn(n, dtype=DTYPE), torch.randn(n, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    args = (x, y, w, b, x.stride(0), n, 1e-5)
    layer_norm_fwd[(rows,)](*args, BLOCK_SIZE=block)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    want = torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5)
    assert_grads(layer_norm_fwd, (rows,), args, {"BLOCK_SIZE": block}, y, want, leaves, ("X", "W", "B"))


def test_loop_strategies_are_named_in_the_source():
    bwd = tritongrad.grad(layer_norm_fwd)
    src = bwd.variant(bwd.writes.best()).parts[0].src  # (the bias may get a kernel of its own: interchange.py)
    # the text is the point (each loop's strategy named): test_layer_norm_three_loops checks this kernel's gradients
    assert "# loop over off: _mean is accumulated linearly" in src
    assert "# loop over off_1: _var is accumulated linearly" in src
    assert "# loop over off_2: no state is carried between iterations" in src
    assert src.count("The reverse loop runs the same iterations, each recomputed before its adjoints.") == 3
    assert "_mean = _mean + a" in src, "the accumulation reads as the forward wrote it"


# -- seed 001: a tiled matmul looping over K, transposes chosen by constexpr flags ---------------


@triton.jit
def dot_kernel(A, B, C, M, N, K, lda, ldb, ldc, AT: tl.constexpr, BT: tl.constexpr,
               TM: tl.constexpr, TN: tl.constexpr, TK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * TM + tl.arange(0, TM)
    rn = pn * TN + tl.arange(0, TN)
    rk = tl.arange(0, TK)
    if AT:  # A holds the K x M transpose
        pa = A + rk[:, None] * lda + rm[None, :]
    else:
        pa = A + rm[:, None] * lda + rk[None, :]
    if BT:  # B holds the N x K transpose
        pb = B + rn[:, None] * ldb + rk[None, :]
    else:
        pb = B + rk[:, None] * ldb + rn[None, :]
    c = tl.zeros((TM, TN), dtype=C.dtype.element_ty)
    for k in range(0, K, TK):
        if AT:
            a = tl.trans(tl.load(pa, mask=(rk[:, None] + k < K) & (rm[None, :] < M), other=0.0))
        else:
            a = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        if BT:
            b = tl.trans(tl.load(pb, mask=(rn[:, None] < N) & (rk[None, :] + k < K), other=0.0))
        else:
            b = tl.load(pb, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        c += tl.dot(a, b)
        pa += TK * (lda if AT else 1)
        pb += TK * (1 if BT else ldb)
    tl.store(C + rm[:, None] * ldc + rn[None, :], c, mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.mark.parametrize("at, bt", [(False, False), (False, True), (True, False), (True, True)])
def test_tiled_matmul_over_k_with_transposes(at, bt):
    m, n, k, tile = 37, 29, 45, 16  # a 3 x 2 grid, three iterations over K, the last partial
    a = torch.randn(k, m, dtype=DTYPE) if at else torch.randn(m, k, dtype=DTYPE)
    b = torch.randn(n, k, dtype=DTYPE) if bt else torch.randn(k, n, dtype=DTYPE)
    c = poison(torch.empty(m, n, dtype=DTYPE))
    args = (a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0))
    meta = {"AT": at, "BT": bt, "TM": tile, "TN": tile, "TK": tile}
    grid = (triton.cdiv(m, tile), triton.cdiv(n, tile))
    dot_kernel[grid](*args, **meta)
    leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    want = (leaves[0].T if at else leaves[0]) @ (leaves[1].T if bt else leaves[1])
    assert_grads(dot_kernel, grid, args, meta, c, want, leaves, ("A", "B"))


def test_matmul_backward_does_not_recompute_the_forward_loop():
    src = tritongrad.grad(dot_kernel).src
    # the text is the point (no forward loop recomputed): test_tiled_matmul_over_k_with_transposes checks this kernel's
    # gradients
    forward, backward = src.split("# grad of: tl.store")
    assert "for k in" not in forward and "tl.dot" not in forward
    assert "# loop over k: c is accumulated linearly" in backward
    assert "pa, pb are updated as in the forward" in backward


# -- index state, tl.dot with an accumulator, tl.range ---------------------------------------------


@triton.jit
def dot_acc_loop(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    rm = pid * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float64)
    k0 = tl.zeros((), dtype=tl.int32)  # a Python 0 cannot be loop-carried in compiled Triton
    for _ in tl.range(0, tl.cdiv(K, BK), num_stages=2):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=tl.float64)  # compiled Triton accumulates in float32 unless told
        k0 += BK
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.exp(acc), mask=(rm[:, None] < M) & (rn[None, :] < N))


def test_dot_accumulator_with_index_state_and_tl_range():
    m, n, k = 23, 19, 41
    a, b = 0.3 * torch.randn(m, k, dtype=DTYPE), 0.3 * torch.randn(k, n, dtype=DTYPE)
    c = poison(torch.empty(m, n, dtype=DTYPE))
    args = (a, b, c, m, n, k)
    meta = {"BM": 16, "BN": 32, "BK": 16}
    grid = (triton.cdiv(m, 16),)
    dot_acc_loop[grid](*args, **meta)
    leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    want = torch.exp(leaves[0] @ leaves[1])
    assert_grads(dot_acc_loop, grid, args, meta, c, want, leaves, ("a_ptr", "b_ptr"))
    assert "k0 is updated as in the forward" in tritongrad.grad(dot_acc_loop).src


@triton.jit
def sum_then_scale(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr, REPS: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.zeros((), dtype=tl.float64)
    for k in range(0, N, BLOCK):  # a scalar accumulator
        offs = k + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + pid * N + offs, mask=offs < N, other=0.0)
        s += tl.sum(x * x)
    for r in tl.static_range(REPS):  # reads s every iteration: its adjoint is carried through the reverse loop
        w = tl.load(w_ptr + r)
        tl.store(y_ptr + pid * REPS + r, tl.sqrt(s) * w)


def test_scalar_accumulator_then_static_range():
    rows, n, reps = 3, 37, 4
    x, w = torch.randn(rows, n, dtype=DTYPE), torch.randn(reps, dtype=DTYPE)
    y = poison(torch.empty(rows, reps, dtype=DTYPE))
    args = (x, w, y, n)
    meta = {"BLOCK": 16, "REPS": reps}
    sum_then_scale[(rows,)](*args, **meta)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    want = (leaves[0] * leaves[0]).sum(1, keepdim=True).sqrt() * leaves[1]
    assert_grads(sum_then_scale, (rows,), args, meta, y, want, leaves, ("x_ptr", "w_ptr"))


# -- pointer state across sequential loops, nested loops, loops that may not run ---------------------


@triton.jit
def two_halves(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    # the first loop walks p over the first half of the row, the second continues from where it stopped
    row = tl.program_id(0)
    p = x_ptr + row * 2 * N
    lo = tl.zeros([BLOCK], dtype=tl.float64)
    for k in range(0, N, BLOCK):
        lo += tl.load(p + tl.arange(0, BLOCK), mask=k + tl.arange(0, BLOCK) < N, other=0.0)
        p += BLOCK
    p += N - tl.cdiv(N, BLOCK) * BLOCK  # back to the end of the first half
    hi = tl.zeros([BLOCK], dtype=tl.float64)
    for k in range(0, N, BLOCK):
        x = tl.load(p + tl.arange(0, BLOCK), mask=k + tl.arange(0, BLOCK) < N, other=1.0)
        hi += tl.log(x * x)
        p += BLOCK
    tl.store(y_ptr + row, tl.sum(lo) * tl.sum(hi))


def test_pointer_state_continues_across_sequential_loops():
    rows, n = 4, 21
    x = torch.randn(rows, 2 * n, dtype=DTYPE)
    y = poison(torch.empty(rows, dtype=DTYPE))
    args = (x, y, n)
    two_halves[(rows,)](*args, BLOCK=8)
    leaf = x.clone().requires_grad_()
    want = leaf[:, :n].sum(1) * torch.log(leaf[:, n:] ** 2).sum(1)
    assert_grads(two_halves, (rows,), args, {"BLOCK": 8}, y, want, [leaf], ("x_ptr",))


@triton.jit
def rows_in_a_loop(x_ptr, w_ptr, y_ptr, t_ptr, C, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for i in range(pid * ROWS, pid * ROWS + ROWS):
        acc = tl.zeros([BLOCK], dtype=tl.float64)
        p = x_ptr + i * stride
        for j in range(0, C, BLOCK):
            cols = j + tl.arange(0, BLOCK)
            x = tl.load(p + tl.arange(0, BLOCK), mask=cols < C, other=0.0)
            w = tl.load(w_ptr + cols, mask=cols < C, other=0.0)
            if i % 2 == 0:  # a runtime branch inside the inner loop
                acc += x * x * w
            else:
                acc += tl.sin(x) * w
            total += x
            p += BLOCK
        tl.store(y_ptr + i, tl.sum(acc))
    tl.store(t_ptr + pid * BLOCK + tl.arange(0, BLOCK), total)


def test_nested_loops_with_a_branch_inside():
    programs, rows_each, c, block = 3, 2, 37, 16
    rows = programs * rows_each
    x, w = torch.randn(rows, c, dtype=DTYPE), torch.randn(c, dtype=DTYPE)
    y = poison(torch.empty(rows, dtype=DTYPE))
    t = poison(torch.empty(programs * block, dtype=DTYPE))
    args = (x, w, y, t, c, x.stride(0))
    meta = {"ROWS": rows_each, "BLOCK": block}
    rows_in_a_loop[(programs,)](*args, **meta)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    even = (torch.arange(rows) % 2 == 0)[:, None]
    want_y = torch.where(even, xr * xr * wr, torch.sin(xr) * wr).sum(1)
    padded = torch.nn.functional.pad(xr, (0, 3 * block - c)).reshape(programs, rows_each, 3, block)
    want_t = padded.sum((1, 2)).reshape(-1)
    torch.testing.assert_close(y, want_y.detach(), **TOL)
    torch.testing.assert_close(t, want_t.detach(), **TOL)
    d_y, d_t = torch.randn_like(y), torch.randn_like(t)
    got = backward_launch(rows_in_a_loop, (programs,), args, meta, {"y_ptr": d_y, "t_ptr": d_t})
    want_x, want_w = torch.autograd.grad((want_y, want_t), (xr, wr), (d_y, d_t))
    torch.testing.assert_close(got["x_ptr"], want_x, **TOL)
    torch.testing.assert_close(got["w_ptr"], want_w, **TOL)
    src = tritongrad.grad(rows_in_a_loop).src
    assert re.search(r"# loop over j: acc, total are accumulated linearly", src)
    assert re.search(r"# loop over i: total is accumulated linearly", src)


@triton.jit
def ragged_rows(x_ptr, len_ptr, y_ptr, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    n = tl.load(len_ptr + row)  # a runtime trip count; zero for some rows
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for k in range(0, n, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0)
        acc += tl.where(cols < n, tl.exp(x), 0.0)
    tl.store(y_ptr + row, tl.sum(acc))


def test_runtime_trip_count_including_zero():
    lengths = torch.tensor([0, 5, 16, 33, 0, 17], dtype=torch.int32)
    x = torch.randn(len(lengths), 40, dtype=DTYPE)
    y = poison(torch.empty(len(lengths), dtype=DTYPE))
    args = (x, lengths, y, x.stride(0))
    ragged_rows[(len(lengths),)](*args, BLOCK=8)
    leaf = x.clone().requires_grad_()
    keep = torch.arange(40)[None, :] < lengths[:, None]
    want = torch.where(keep, torch.exp(leaf), 0.0).sum(1)
    assert_grads(ragged_rows, (len(lengths),), args, {"BLOCK": 8}, y, want, [leaf], ("x_ptr",))
    assert tritongrad.grad(ragged_rows).wrt == ("x_ptr",)


# -- carried state used nonlinearly: a state tape (checkpoints where it is large), else rebuilt ---------


@triton.jit
def online_softmax_variants(x_ptr, v_ptr, y_ptr, m_ptr, N, D, stride_x, stride_v, BLOCK: tl.constexpr,
                            BD: tl.constexpr, FROM_ONE: tl.constexpr, NORMALIZE: tl.constexpr, KEEP_MAX: tl.constexpr,
                            UNSCALED_SUM: tl.constexpr):
    # y = softmax(x[row]) @ v in one pass over the columns: an online softmax, as attention kernels do it.
    # FROM_ONE: the sum starts at 1, as the Triton tutorial writes it (the first rescaling by exp(-inf) wipes it;
    # the rewrite scales the start to the final max); NORMALIZE=False: the rescaled accumulator is stored as it
    # is, so the max does not cancel; KEEP_MAX: the row's max is stored too; UNSCALED_SUM: the sum is not rescaled
    # (a bug, but a function of its own, which a max pass would change). In each but the first, the max does not
    # only stabilize (as far as online.py can prove)
    row = tl.program_id(0)
    d = tl.arange(0, BD)
    m = tl.full((), float("-inf"), tl.float64)
    if FROM_ONE:
        l = tl.zeros((), dtype=tl.float64) + 1.0
    else:
        l = tl.zeros((), dtype=tl.float64)
    acc = tl.zeros([BD], dtype=tl.float64)
    for k in range(0, N, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N, other=float("-inf"))
        v = tl.load(v_ptr + cols[:, None] * stride_v + d[None, :], mask=(cols[:, None] < N) & (d[None, :] < D),
                    other=0.0)
        m_new = tl.maximum(m, tl.max(x))
        alpha = tl.exp(m - m_new)
        p = tl.exp(x - m_new)
        if UNSCALED_SUM:
            l = l + tl.sum(p)
        else:
            l = l * alpha + tl.sum(p)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    if NORMALIZE:
        acc = acc / l
    tl.store(y_ptr + row * D + d, acc, mask=d < D)
    if KEEP_MAX:
        tl.store(m_ptr + row, m)


def softmax_weighted_inputs(**flags):
    """Arguments of online_softmax_variants (a poisoned max buffer) and its meta-parameters: every flag off but
    those given."""
    rows, n, dim = 4, 45, 7
    x, v = 3 * torch.randn(rows, n, dtype=DTYPE), torch.randn(n, dim, dtype=DTYPE)
    y, m = poison(torch.empty(rows, dim, dtype=DTYPE)), poison(torch.empty(rows, dtype=DTYPE))
    meta = {"BLOCK": 16, "BD": 8, "FROM_ONE": False, "NORMALIZE": True, "KEEP_MAX": False, "UNSCALED_SUM": False,
            **flags}
    return (x, v, y, m, n, dim, x.stride(0), v.stride(0)), meta


@pytest.mark.parametrize("flags", [{}, {"FROM_ONE": True}], ids=["a sum from zero", "a sum starting at one"])
def test_online_softmax_becomes_a_max_pass_and_linear_sums(flags):
    args, meta = softmax_weighted_inputs(**flags)
    x, v, y = args[:3]
    online_softmax_variants[(x.shape[0],)](*args, **meta)
    leaves = [x.clone().requires_grad_(), v.clone().requires_grad_()]
    want = torch.softmax(leaves[0], dim=1) @ leaves[1]
    assert_grads(online_softmax_variants, (x.shape[0],), args, meta, y, want, leaves, ("x_ptr", "v_ptr"))
    src = tritongrad.grad(online_softmax_variants, constexprs=meta).src
    assert "# online softmax: the running max m only stabilizes" in src, src
    assert "# loop over k: l, acc are accumulated linearly" in src
    assert "m_final = tg.stop_gradient(m_max)" in src and "tape" not in src


@pytest.mark.parametrize("budget", [None, 1], ids=["a slot per iteration", "one checkpoint"])
def test_online_softmax_whose_max_is_stored_keeps_its_state_on_a_tape(budget, monkeypatch):
    # a budget of one byte leaves one slot per program: every reverse iteration re-runs those before it
    if budget is not None:
        monkeypatch.setattr(tritongrad.reverse.state_tape, "TAPE_BUDGET", budget)
    args, meta = softmax_weighted_inputs(KEEP_MAX=True)
    x, v, y, m = args[:4]
    online_softmax_variants[(x.shape[0],)](*args, **meta)
    leaves = [x.clone().requires_grad_(), v.clone().requires_grad_()]
    want = (torch.softmax(leaves[0], dim=1) @ leaves[1], leaves[0].amax(1))
    torch.testing.assert_close((y, m), tuple(w.detach() for w in want), **TOL)
    d_y, d_m = torch.randn_like(y), torch.randn_like(m)
    got = backward_launch(online_softmax_variants, (x.shape[0],), args, meta, {"y_ptr": d_y, "m_ptr": d_m})
    for name, w in zip(("x_ptr", "v_ptr"), torch.autograd.grad(want, leaves, (d_y, d_m)), strict=True):
        torch.testing.assert_close(got[name], w, **TOL)
    src = tritongrad.grad(online_softmax_variants, constexprs=meta).src
    assert "# loop over k: l, acc, m are carried nonlinearly" in src and "online softmax" not in src
    assert "keeps the state at the start of each iteration on a tape" in src and "quadratic" not in src
    assert "l_tape_row = tg.tape_row(l_tape, l, k_slots, tg.program_index(), tl.float64)" in src


def unscaled_sum_reference(x, v, block):
    """online_softmax_variants with UNSCALED_SUM, block by block in PyTorch."""
    m = torch.full((x.shape[0], 1), float("-inf"), dtype=x.dtype)
    l, acc = torch.zeros_like(m), torch.zeros(x.shape[0], v.shape[1], dtype=x.dtype)
    for k in range(0, x.shape[1], block):
        xs, vs = x[:, k:k + block], v[k:k + block]
        m_new = torch.maximum(m, xs.amax(1, keepdim=True))
        p = torch.exp(xs - m_new)
        l, acc, m = l + p.sum(1, keepdim=True), acc * torch.exp(m - m_new) + p @ vs, m_new
    return acc / l


@pytest.mark.parametrize("flags", [{"NORMALIZE": False}, {"UNSCALED_SUM": True}],
                         ids=["a rescaled sum stored as it is", "a sum not rescaled"])
def test_an_online_softmax_the_rewrite_cannot_prove_keeps_its_state_on_a_tape(flags):
    args, meta = softmax_weighted_inputs(**flags)
    x, v, y = args[:3]
    online_softmax_variants[(x.shape[0],)](*args, **meta)
    leaves = [x.clone().requires_grad_(), v.clone().requires_grad_()]
    if meta["UNSCALED_SUM"]:
        want = unscaled_sum_reference(*leaves, meta["BLOCK"])
    elif meta["NORMALIZE"]:
        want = torch.softmax(leaves[0], dim=1) @ leaves[1]
    else:
        want = torch.exp(leaves[0] - leaves[0].amax(1, keepdim=True)) @ leaves[1]
    assert_grads(online_softmax_variants, (x.shape[0],), args, meta, y, want, leaves, ("x_ptr", "v_ptr"))
    src = tritongrad.grad(online_softmax_variants, constexprs=meta).src
    assert "are carried nonlinearly" in src and "online softmax" not in src


def test_tape_slots_are_sized_by_the_trip_count_and_the_budget(monkeypatch):
    from tritongrad.analysis.launch_values import Expr, LaunchValues
    from tritongrad.reverse.state_tape import StateTape

    tape = StateTape("k_slots", (("l_tape", ()), ("acc_tape", ("BD",))), Expr("trips", (
        Expr.const(0), Expr.name("N"), Expr.name("BLOCK"))))
    launch = LaunchValues({"N": 45, "BLOCK": 16, "BD": 8}, (4,))
    args = tape.allocate(launch, 4, "cpu")
    assert args["k_slots"] == 3  # one per iteration
    assert args["l_tape"].numel() == 4 * 3 * 8 and args["acc_tape"].numel() == 4 * 3 * 8 * 8
    unknown = StateTape("k_slots", (("l_tape", ()),), None)
    assert unknown.allocate(launch, 4, "cpu")["k_slots"] == tritongrad.reverse.state_tape.MAX_SLOTS
    monkeypatch.setattr(tritongrad.reverse.state_tape, "TAPE_BUDGET", 4 * 9 * 8 * 2)  # two slots' worth for 4 programs
    assert tape.allocate(launch, 4, "cpu")["k_slots"] == 2


@triton.jit
def pointer_recurrence(x_ptr, y_ptr, N, T, BLOCK: tl.constexpr):
    # the carried pointer moves with the state: no tape for it, so the state is rebuilt from the entry
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p = x_ptr + offs * T
    h = tl.zeros([BLOCK], dtype=tl.float64)
    for _t in range(T):
        h = tl.sin(h) * tl.load(p, mask=offs < N, other=0.0) + 0.5
        p += 1
    tl.store(y_ptr + offs, h, mask=offs < N)


def test_a_carried_pointer_falls_back_to_rebuilding_the_state():
    lanes, steps = 5, 6
    x = torch.randn(lanes, steps, dtype=DTYPE)
    y = poison(torch.empty(lanes, dtype=DTYPE))
    args, meta = (x, y, lanes, steps), {"BLOCK": 4}
    pointer_recurrence[(2,)](*args, **meta)
    leaf = x.clone().requires_grad_()
    h = torch.zeros(lanes, dtype=DTYPE)
    for t in range(steps):
        h = torch.sin(h) * leaf[:, t] + 0.5
    assert_grads(pointer_recurrence, (2,), args, meta, y, h, [leaf], ("x_ptr",))
    src = tritongrad.grad(pointer_recurrence).src
    assert "quadratic in the trip count: no tape, p is a pointer" in src, src


@triton.jit
def linear_recurrence(a_ptr, b_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.zeros([BLOCK], dtype=tl.float64)
    for t in range(T):  # h_t = h_{t-1} * a_t + b_t, every step stored
        h = h * tl.load(a_ptr + t * 2 * BLOCK + offs) + tl.load(b_ptr + t * 2 * BLOCK + offs)
        tl.store(y_ptr + t * 2 * BLOCK + offs, tl.sin(h))


def test_recurrence_with_every_step_stored():
    steps, block = 7, 8
    a = torch.rand(steps, 2 * block, dtype=DTYPE) + 0.5
    b = torch.randn(steps, 2 * block, dtype=DTYPE)
    y = poison(torch.empty(steps, 2 * block, dtype=DTYPE))
    args = (a, b, y, steps)
    linear_recurrence[(2,)](*args, BLOCK=block)
    leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    h, outs = torch.zeros(2 * block, dtype=DTYPE), []
    for t in range(steps):
        h = h * leaves[0][t] + leaves[1][t]
        outs.append(torch.sin(h))
    assert_grads(linear_recurrence, (2,), args, {"BLOCK": block}, y, torch.stack(outs), leaves, ("a_ptr", "b_ptr"))


@triton.jit
def running_sums(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for t in range(T):  # every partial sum stored: its adjoint differs from one iteration to the next
        acc += tl.load(x_ptr + t * 3 * BLOCK + offs)
        tl.store(y_ptr + t * 3 * BLOCK + offs, acc * acc)


def test_partial_sums_stored_every_iteration():
    steps, block = 6, 8
    x = torch.randn(steps, 3 * block, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    running_sums[(3,)](x, y, steps, BLOCK=block)
    leaf = x.clone().requires_grad_()
    want = torch.cumsum(leaf, 0) ** 2
    assert_grads(running_sums, (3,), (x, y, steps), {"BLOCK": block}, y, want, [leaf], ("x_ptr",))


@triton.jit
def last_value(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.zeros([BLOCK], dtype=tl.float64)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for t in range(T):
        x = tl.load(x_ptr + t * BLOCK + offs)  # replaced each iteration: only the last one's reaches y
        if t % 2 == 0:
            acc += tl.load(x_ptr + t * BLOCK + offs).to(tl.float64)
        else:
            acc = acc - 2.0 * tl.load(x_ptr + t * BLOCK + offs)
    tl.store(y_ptr + offs, x * acc)


def test_a_replaced_value_is_not_taken_for_an_accumulator():
    steps, block = 5, 8
    x = torch.randn(steps, block, dtype=DTYPE)
    y = poison(torch.empty(block, dtype=DTYPE))
    last_value[(1,)](x, y, steps, BLOCK=block)
    leaf = x.clone().requires_grad_()
    signs = torch.tensor([1.0, -2.0, 1.0, -2.0, 1.0], dtype=DTYPE)[:, None]
    want = leaf[-1] * (signs * leaf).sum(0)
    assert_grads(last_value, (1,), (x, y, steps), {"BLOCK": block}, y, want, [leaf], ("x_ptr",))
    src = tritongrad.grad(last_value).src
    assert "x is carried nonlinearly (x: it is overwritten" in src and "acc is accumulated linearly" in src, src


@triton.jit
def prefetching_matmul(A, B, C, M, N, K, lda, ldb, ldc, TM: tl.constexpr, TN: tl.constexpr, TK: tl.constexpr):
    # seed 001's original loop: tiles loaded one iteration ahead, the counter running down by TK
    rm = tl.program_id(0) * TM + tl.arange(0, TM)
    rn = tl.program_id(1) * TN + tl.arange(0, TN)
    rk = tl.arange(0, TK)
    pa = A + rm[:, None] * lda + rk[None, :]
    pb = B + rk[:, None] * ldb + rn[None, :]
    a = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    b = tl.load(pb, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
    c = tl.zeros((TM, TN), dtype=C.dtype.element_ty)
    for k in range(K, 0, -TK):
        c += tl.dot(a, b)
        pa += TK
        pb += TK * ldb
        a = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] < k - TK), other=0.0)
        b = tl.load(pb, mask=(rk[:, None] < k - TK) & (rn[None, :] < N), other=0.0)
    tl.store(C + rm[:, None] * ldc + rn[None, :], c, mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.mark.parametrize("k", [37, 32])
def test_prefetching_matmul_with_a_negative_step(k):
    m, n, tile = 21, 19, 16
    a, b = torch.randn(m, k, dtype=DTYPE), torch.randn(k, n, dtype=DTYPE)
    c = poison(torch.empty(m, n, dtype=DTYPE))
    args = (a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0))
    meta = {"TM": tile, "TN": tile, "TK": tile}
    grid = (triton.cdiv(m, tile), triton.cdiv(n, tile))
    prefetching_matmul[grid](*args, **meta)
    leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    assert_grads(prefetching_matmul, grid, args, meta, c, leaves[0] @ leaves[1], leaves, ("A", "B"))
    assert "tg.trip_count(K, 0, -TK)" in tritongrad.grad(prefetching_matmul).src


@triton.jit
def two_online_log_sum_exps(x_ptr, z_ptr, y_ptr, N, BLOCK: tl.constexpr):
    # logsumexp(x[row]) + logsumexp(z[row]): two online loops in one block, each rewritten
    row = tl.program_id(0)
    m = tl.full((), float("-inf"), tl.float64)
    s = tl.zeros((), dtype=tl.float64)
    for k in range(0, N, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    mz = tl.full((), float("-inf"), tl.float64)
    sz = tl.zeros((), dtype=tl.float64)
    for k in range(0, N, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + row * N + cols, mask=cols < N, other=float("-inf"))
        mz_new = tl.maximum(mz, tl.max(z))
        sz = sz * tl.exp2(mz - mz_new) + tl.sum(tl.exp2(z - mz_new))
        mz = mz_new
    tl.store(y_ptr + row, m + tl.log(s) + mz + tl.log2(sz))


def test_two_online_loops_in_one_block_are_both_rewritten():
    rows, n = 3, 37
    x, z = torch.randn(rows, n, dtype=DTYPE), torch.randn(rows, n, dtype=DTYPE)
    y = poison(torch.empty(rows, dtype=DTYPE))
    args, meta = (x, z, y, n), {"BLOCK": 16}
    two_online_log_sum_exps[(rows,)](*args, **meta)
    leaves = [x.clone().requires_grad_(), z.clone().requires_grad_()]
    want = torch.logsumexp(leaves[0], 1) + torch.logsumexp(leaves[1] * math.log(2), 1) / math.log(2)
    assert_grads(two_online_log_sum_exps, (rows,), args, meta, y, want, leaves, ("x_ptr", "z_ptr"))
    src = tritongrad.grad(two_online_log_sum_exps).src
    assert src.count("# online softmax: the running max") == 2 and "tape" not in src, src


@triton.jit
def truncated_logsumexp(x_ptr, y_ptr, z_ptr, N, BLOCK: tl.constexpr):
    """An online log-sum-exp per row, stored as it is and truncated to an integer (fuzz seed 3302, kernel 1129)."""
    row = tl.program_id(0)
    m = tl.full((), float("-inf"), tl.float64)
    s = tl.zeros((), dtype=tl.float64)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(y_ptr + row, lse)
    tl.store(z_ptr + row, lse.to(tl.int32).to(tl.float64))


def test_an_online_loop_whose_result_is_cast_to_an_integer_stays_as_written():
    """A cast to tl.int32 on the final max's path is not a float cast the rewrite may check at compile time (it
    was wrapped in tg.to_float, whose check failed when compiled): the loop keeps its state tape, and the
    gradient is the forward's (none through the integer)."""
    x = torch.randn(3, 37, dtype=torch.float64) * 4
    y, z = (poison(torch.empty(3, dtype=torch.float64)) for _ in range(2))
    args, meta = (x, y, z, 37), {"BLOCK": 16}
    truncated_logsumexp[(3,)](*args, **meta)
    leaf = x.clone().requires_grad_()
    want = torch.logsumexp(leaf, dim=1)
    torch.testing.assert_close((y, z), (want.detach(), want.detach().trunc()), **TOL)
    d_y, d_z = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    got = backward_launch(truncated_logsumexp, (3,), args, meta, {"y_ptr": d_y, "z_ptr": d_z})
    torch.testing.assert_close(got["x_ptr"], torch.autograd.grad(want, leaf, d_y)[0], **TOL)
    assert "tg.to_float" not in tritongrad.grad(truncated_logsumexp, constexprs=meta).src


@triton.jit
def offset_by_logsumexp(x_ptr, z_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """y[row] = sigmoid(z[row]) + logsumexp(x[row]): an online loop whose max and sum a later loop reads (fuzz seed
    9103, kernel 1184: the later loop, renamed by the rewrite, was looked for by its old tag)."""
    row = tl.program_id(0)
    m = tl.full((), float("-inf"), tl.float64)
    s = tl.zeros((), dtype=tl.float64)
    for start in range(N - BLOCK, -BLOCK, -BLOCK):  # counting down, as the fuzzed kernel did
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=(cols >= 0) & (cols < N), other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + row * N + cols, mask=cols < N)
        tl.store(y_ptr + row * N + cols, tl.sigmoid(z) + (m + tl.log(s)), mask=cols < N)


def test_a_later_loop_reading_an_online_loops_max_and_sum():
    rows, n = 3, 45  # partial blocks at both ends of the counting-down loop, and at the end of the other
    x, z = torch.randn(rows, n, dtype=DTYPE), torch.randn(rows, n, dtype=DTYPE)
    y = poison(torch.empty(rows, n, dtype=DTYPE))
    args, meta = (x, z, y, n), {"BLOCK": 16}
    offset_by_logsumexp[(rows,)](*args, **meta)
    leaves = [x.clone().requires_grad_(), z.clone().requires_grad_()]
    want = torch.sigmoid(leaves[1]) + torch.logsumexp(leaves[0], 1, keepdim=True)
    assert_grads(offset_by_logsumexp, (rows,), args, meta, y, want, leaves, ("x_ptr", "z_ptr"))
    assert "# online softmax: the running max" in tritongrad.grad(offset_by_logsumexp).src


@triton.jit
def static_nonlinear_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, REPS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    h = tl.zeros((BLOCK,), dtype=tl.float64)
    p = x_ptr + offs
    for _ in tl.static_range(REPS):  # nonlinear state, no tape: the reverse loop rebuilds it by recomputing
        h = tl.sin(h) + tl.load(p, mask=mask)
        p += N
    tl.store(y_ptr + offs, h, mask=mask)


@pytest.mark.compiled
def test_a_static_loop_rebuilding_its_state_compiles():
    """The reverse of a `tl.static_range` loop whose nonlinear state each iteration rebuilds by recomputing the ones
    before: its trip count and each recomputation's bound are constexprs (compiled, `trips = REPS` then
    `tl.static_range(trips)` was refused: "used as tl.static_range start value is not a constexpr"; the
    interpreter ran it). Found by the CUDA-graph capture of fuzzed kernels."""
    @tritongrad.op
    def recurrence(x):
        y = torch.empty(x.shape[1], dtype=x.dtype, device=x.device)
        static_nonlinear_kernel[(1,)](x, y, x.shape[1], BLOCK=32, REPS=x.shape[0])
        return y

    def reference(x):
        h = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
        for row in x:
            h = torch.sin(h) + row
        return h

    x = torch.randn(3, 29, dtype=DTYPE, requires_grad=True)
    g = torch.randn(29, dtype=DTYPE)
    y = recurrence(x)
    torch.testing.assert_close(y, reference(x))
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(reference(x), x, g)[0])
