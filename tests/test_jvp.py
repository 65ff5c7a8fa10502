"""Tangent (forward-mode) kernels: ``tritongrad.jvp(kernel)`` against ``torch.func.jvp`` of a plain-PyTorch reference.

float64 in the interpreter, sizes that are not powers of two, random inputs and random tangents, output buffers and
their tangents poisoned with NaN (an element the tangent kernel forgets to write fails)."""

import inspect
import re

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.core.source import unwrap
from tritongrad.examples import cross_entropy, flash_attention, matmul, rmsnorm, softmax, swiglu
from tritongrad.tools.testing import poison

DTYPE = torch.float64
TOL = {"rtol": 1e-9, "atol": 1e-9}


def jvp_launch(kernel, grid, args, kwargs, tangents, outputs, wrt=None):
    """Launch ``kernel``'s tangent kernel as the forward ``kernel[grid](*args, **kwargs)``: ``tangents`` (input
    parameter -> its tangent); returns each output parameter's (value, tangent), both poisoned before."""
    params = list(inspect.signature(unjit(kernel)).parameters)
    named = dict(zip(params, args, strict=False))
    t_out = {}
    for p in outputs:
        poison(named[p])
        t_out[p] = poison(torch.empty_like(named[p]))
    tangent_kernel = tritongrad.jvp(kernel, wrt=wrt if wrt is not None else list(tangents), outputs=outputs)
    tangent_kernel[grid](*args, **{f"t_{p}": t for p, t in tangents.items()}, **{f"t_{p}": t for p, t in t_out.items()},
                         **kwargs)
    return {p: (named[p], t_out[p]) for p in outputs}


def unjit(kernel):
    return unwrap(kernel).fn


def reference_jvp(reference, primals, tangents):
    return torch.func.jvp(reference, tuple(primals), tuple(tangents))


def randn(*shape):
    return torch.randn(*shape, dtype=DTYPE)


# -- elementwise -----------------------------------------------------------------------------------------------


@triton.jit
def elementwise_kernel(a_ptr, b_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=1.0)
    s = tl.load(s_ptr)  # a scalar broadcast over the block
    y = tl.sin(a) * tl.exp(b) / (1.0 + a * a) + tl.maximum(a, b) - tl.minimum(a, 0.5 * b)
    y += tl.where(a > 0, tl.log(1.0 + a * a), b * s) + tl.sqrt(tl.abs(b) + 1.0) * tl.sigmoid(a) - a * a * a
    y = y * s + tl.cos(b) / s + tl.clamp(a, -0.5, tl.abs(b) - 0.25)
    tl.store(y_ptr + offs, y, mask=mask)


def elementwise_reference(a, b, s):
    y = torch.sin(a) * torch.exp(b) / (1 + a * a) + torch.maximum(a, b) - torch.minimum(a, 0.5 * b)
    y = y + torch.where(a > 0, torch.log(1 + a * a), b * s) + torch.sqrt(b.abs() + 1) * torch.sigmoid(a) - a * a * a
    return y * s + torch.cos(b) / s + torch.minimum(torch.maximum(a, torch.full_like(a, -0.5)), b.abs() - 0.25)


def test_elementwise_operations_and_a_broadcast_scalar():
    n = 1000
    a, b, s = randn(n), randn(n), randn(1) + 3.0
    ta, tb, ts = randn(n), randn(n), randn(1)
    y = torch.empty(n, dtype=DTYPE)
    got = jvp_launch(elementwise_kernel, (triton.cdiv(n, 128),), (a, b, s, y, n), {"BLOCK": 128},
                     {"a_ptr": ta, "b_ptr": tb, "s_ptr": ts}, ["y_ptr"])
    want, want_t = reference_jvp(elementwise_reference, (a, b, s), (ta, tb, ts))
    torch.testing.assert_close(got["y_ptr"], (want, want_t), **TOL)


def test_only_some_inputs_differentiated():
    n = 300
    a, b, s = randn(n), randn(n), randn(1) + 3.0
    ta = randn(n)
    y = torch.empty(n, dtype=DTYPE)
    got = jvp_launch(elementwise_kernel, (triton.cdiv(n, 128),), (a, b, s, y, n), {"BLOCK": 128}, {"a_ptr": ta},
                     ["y_ptr"])
    _, want_t = reference_jvp(lambda a: elementwise_reference(a, b, s), (a,), (ta,))
    torch.testing.assert_close(got["y_ptr"][1], want_t, **TOL)


def test_swiglu_example():
    a, b = randn(5, 61), randn(5, 61)
    ta, tb = randn(5, 61), randn(5, 61)
    launch = swiglu.swiglu_launch(a, b)
    got = jvp_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"a_ptr": ta, "b_ptr": tb}, ["y_ptr"])
    torch.testing.assert_close(got["y_ptr"], reference_jvp(swiglu.reference, (a, b), (ta, tb)), **TOL)


# -- reductions: rmsnorm, softmax (two-pass and online), cross entropy ------------------------------------------


def test_rmsnorm_example_both_outputs():
    x, w = randn(7, 45), randn(45)
    tx, tw = randn(7, 45), randn(45)
    launch = rmsnorm.rmsnorm_launch(x, w)
    rstd = launch.args[3]
    got = jvp_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"x_ptr": tx, "w_ptr": tw},
                     ["y_ptr", "rstd_ptr"])

    def reference(x, w):
        r = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
        return x * r[:, None] * w, r

    (y, r), (ty, tr) = reference_jvp(reference, (x, w), (tx, tw))
    torch.testing.assert_close(got["y_ptr"], (y, ty), **TOL)
    torch.testing.assert_close(got["rstd_ptr"], (r, tr), **TOL)
    assert got["rstd_ptr"][0] is rstd


def test_softmax_example():
    x, tx = randn(6, 37), randn(6, 37)
    launch = softmax.softmax_launch(x)
    got = jvp_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"x_ptr": tx}, ["y_ptr"])
    torch.testing.assert_close(got["y_ptr"], reference_jvp(softmax.reference, (x,), (tx,)), **TOL)


@triton.jit
def online_softmax_kernel(x_ptr, y_ptr, lse_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full((), -float("inf"), x_ptr.dtype.element_ty)  # (typed: a loop-carried value keeps its type compiled)
    d = tl.zeros((), x_ptr.dtype.element_ty)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    tl.store(lse_ptr + row, m + tl.log(d))
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
        tl.store(y_ptr + row * n + cols, tl.exp(x - m) / d, mask=cols < n)


@pytest.mark.parametrize("ties", [False, True])
def test_online_softmax_with_its_log_sum_exp(ties):
    rows, n = 5, 53
    x, tx = randn(rows, n), randn(rows, n)
    if ties:  # the row's max in several blocks and within one: the running max ties the block's max
        x[:, 3] = x[:, 20] = x[:, 40] = x[:, 41] = x.max() + 1.0
    y, lse = torch.empty_like(x), torch.empty(rows, dtype=DTYPE)
    got = jvp_launch(online_softmax_kernel, (rows,), (x, y, lse, n), {"BLOCK": 16}, {"x_ptr": tx},
                     ["y_ptr", "lse_ptr"])
    (want_y, want_lse), (ty, tlse) = reference_jvp(lambda x: (torch.softmax(x, -1), torch.logsumexp(x, -1)),
                                                   (x,), (tx,))
    torch.testing.assert_close(got["y_ptr"], (want_y, ty), **TOL)
    torch.testing.assert_close(got["lse_ptr"], (want_lse, tlse), **TOL)


def test_cross_entropy_example_reads_the_target_logit_by_index():
    logits, target, _ = cross_entropy.make_inputs((7, 101), DEVICE, dtype=DTYPE)
    target[2] = cross_entropy.IGNORE_INDEX
    t_logits = randn(7, 101)
    launch = cross_entropy.cross_entropy_launch(logits, target)
    got = jvp_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"logits_ptr": t_logits}, ["loss_ptr"])
    want = reference_jvp(lambda z: cross_entropy.reference(z, target), (logits,), (t_logits,))
    torch.testing.assert_close(got["loss_ptr"], want, **TOL)


# -- loops and branches -------------------------------------------------------------------------------------------


@triton.jit
def recurrence_kernel(a_ptr, b_ptr, h_ptr, T, C, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    h = tl.zeros([BLOCK], dtype=tl.float64)
    for t in range(T):
        a = tl.load(a_ptr + t * C + cols, mask=mask, other=0.0)
        b = tl.load(b_ptr + t * C + cols, mask=mask, other=0.0)
        h = tl.sigmoid(a) * h + tl.sin(b) * (1.0 - h * h)
        tl.store(h_ptr + t * C + cols, h, mask=mask)


def recurrence_reference(a, b):
    h, out = torch.zeros(a.shape[1], dtype=a.dtype), []
    for t in range(a.shape[0]):
        h = torch.sigmoid(a[t]) * h + torch.sin(b[t]) * (1 - h * h)
        out.append(h)
    return torch.stack(out)


def test_a_loop_carrying_nonlinear_state():
    T, C = 9, 37
    a, b, ta, tb = randn(T, C), randn(T, C), randn(T, C), randn(T, C)
    h = torch.empty(T, C, dtype=DTYPE)
    got = jvp_launch(recurrence_kernel, (triton.cdiv(C, 16),), (a, b, h, T, C), {"BLOCK": 16},
                     {"a_ptr": ta, "b_ptr": tb}, ["h_ptr"])
    torch.testing.assert_close(got["h_ptr"], reference_jvp(recurrence_reference, (a, b), (ta, tb)), **TOL)


@triton.jit
def branch_kernel(x_ptr, w_ptr, y_ptr, flag, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    w = tl.load(w_ptr)
    scale = tl.full((), 2.0, w.dtype)  # (typed: both branches must leave it one type compiled)
    if flag > 0:
        y = tl.exp(x) * w
        scale = w * w
    else:
        y = x * x
    tl.store(y_ptr + offs, y * scale, mask=mask)


@pytest.mark.parametrize("flag", [1, 0])
def test_a_branch_on_a_runtime_scalar(flag):
    n = 77
    x, w, tx, tw = randn(n), randn(1), randn(n), randn(1)
    y = torch.empty(n, dtype=DTYPE)
    got = jvp_launch(branch_kernel, (triton.cdiv(n, 32),), (x, w, y, flag, n), {"BLOCK": 32},
                     {"x_ptr": tx, "w_ptr": tw}, ["y_ptr"])

    def reference(x, w):
        return torch.exp(x) * w * (w * w) if flag > 0 else x * x * 2.0

    torch.testing.assert_close(got["y_ptr"], reference_jvp(reference, (x, w), (tx, tw)), **TOL)


# -- tl.dot: matmul and flash attention (the online softmax in one pass) -------------------------------------------


def test_matmul_example():
    a, b = randn(45, 37), randn(37, 70)
    ta, tb = randn(45, 37), randn(37, 70)
    launch = matmul.matmul_launch(a, b, config={"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16})
    grid = launch.grid(launch.kwargs)
    got = jvp_launch(launch.kernel, grid, launch.args, launch.kwargs, {"a_ptr": ta, "b_ptr": tb}, ["c_ptr"])
    torch.testing.assert_close(got["c_ptr"], reference_jvp(torch.matmul, (a, b), (ta, tb)), **TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_example(causal):
    q, k, v, _ = flash_attention.make_inputs((2, 37, 12), DEVICE, dtype=DTYPE)
    tq, tk, tv = randn(*q.shape), randn(*q.shape), randn(*q.shape)
    launch = flash_attention.flash_attention_launch(q, k, v, causal)
    got = jvp_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"q_ptr": tq, "k_ptr": tk, "v_ptr": tv},
                     ["o_ptr"])
    want = reference_jvp(lambda q, k, v: _attention(q, k, v, causal), (q, k, v), (tq, tk, tv))
    torch.testing.assert_close(got["o_ptr"], want, **TOL)


def _attention(q, k, v, causal):
    s = q @ k.transpose(-1, -2) * flash_attention.softmax_scale(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


@triton.jit
def two_stage_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, D, scale, BM: tl.constexpr,
                               BN: tl.constexpr, BD: tl.constexpr):
    """Causal attention as the tutorial stages it: the key blocks before the diagonal unmasked, then the diagonal
    ones masked, the running max, sum and accumulator carried from the first loop into the second; the log-sum-exp
    stored too (a value the running max reaches, which the proof shows independent of it)."""
    head = tl.program_id(1)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    base = head * N * D
    q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < N) & (rd[None, :] < D), other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float64)
    l_i = tl.zeros([BM], dtype=tl.float64)
    acc = tl.zeros([BM, BD], dtype=tl.float64)
    for start in range(0, tl.program_id(0) * BM, BN):  # before the diagonal: every key visible
        rn = start + tl.arange(0, BN)
        k = tl.load(k_ptr + base + rn[:, None] * D + rd[None, :], mask=rd[None, :] < D, other=0.0)
        v = tl.load(v_ptr + base + rn[:, None] * D + rd[None, :], mask=rd[None, :] < D, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    for start in range(tl.program_id(0) * BM, tl.minimum((tl.program_id(0) + 1) * BM, N), BN):  # the diagonal
        rn = start + tl.arange(0, BN)
        kv_mask = (rn[:, None] < N) & (rd[None, :] < D)
        k = tl.load(k_ptr + base + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + base + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where((rn[None, :] <= rm[:, None]) & (rn[None, :] < N), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], acc / l_i[:, None],
             mask=(rm[:, None] < N) & (rd[None, :] < D))
    tl.store(lse_ptr + head * N + rm, m_i + tl.log(l_i), mask=rm < N)


def test_a_two_stage_attention_without_the_running_maxs_tangent():
    """The running max carried through both stages has no tangent (online.py proves it only stabilizes: no
    extremum tangent in the kernel), and the output's and the log-sum-exp's tangents are still PyTorch's."""
    heads, n, d = 2, 37, 12
    q, k, v = randn(heads, n, d), randn(heads, n, d), randn(heads, n, d)
    tq, tk, tv = randn(heads, n, d), randn(heads, n, d), randn(heads, n, d)
    o, lse = torch.empty_like(q), torch.empty(heads, n, dtype=DTYPE)
    scale = d ** -0.5
    got = jvp_launch(two_stage_attention_kernel, (triton.cdiv(n, 16), heads), (q, k, v, o, lse, n, d, scale),
                     {"BM": 16, "BN": 16, "BD": 16}, {"q_ptr": tq, "k_ptr": tk, "v_ptr": tv}, ["o_ptr", "lse_ptr"])

    def reference(q, k, v):
        s = (q @ k.transpose(-1, -2) * scale).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

    (want_o, want_lse), (to, tlse) = reference_jvp(reference, (q, k, v), (tq, tk, tv))
    torch.testing.assert_close(got["o_ptr"], (want_o, to), **TOL)
    torch.testing.assert_close(got["lse_ptr"], (want_lse, tlse), **TOL)
    assert "extremum_tangent" not in tritongrad.jvp(two_stage_attention_kernel, wrt=["q_ptr", "k_ptr", "v_ptr"],
                                                    outputs=["o_ptr", "lse_ptr"]).src


# -- scans, atomics, masked stores -------------------------------------------------------------------------------


@triton.jit
def cumsum_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
    y = tl.cumsum(x * x, axis=0) * tl.cumsum(x, axis=0, reverse=True)
    tl.store(y_ptr + row * n + cols, y, mask=cols < n)


def test_cumsum():
    x, tx = randn(4, 29), randn(4, 29)
    y = torch.empty_like(x)
    got = jvp_launch(cumsum_kernel, (4,), (x, y, 29), {"BLOCK": 32}, {"x_ptr": tx}, ["y_ptr"])

    def reference(x):
        return torch.cumsum(x * x, -1) * torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])

    torch.testing.assert_close(got["y_ptr"], reference_jvp(reference, (x,), (tx,)), **TOL)


@triton.jit
def rank_raising_sum_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    grid = (cols[:, None] * 2 + cols[None, :]).to(tl.float64)  # (BLOCK, BLOCK), no tangent
    tl.store(y_ptr + cols[:, None] * n + cols[None, :], grid + tl.sin(x), mask=mask[:, None] & mask[None, :])


def test_a_sum_whose_only_tangent_has_a_lower_rank_broadcasts_it():
    """Fuzzer finding (seed 5051, kernel 246): in `grid + sin(x)` only the (BLOCK,) operand has a tangent, which the
    tangent kernel broadcast to the (BLOCK, BLOCK) sum with `tl.broadcast_to`, whose ranks must be equal: "Cannot
    broadcast, rank mismatch"."""
    x, tx = randn(13), randn(13)
    y = torch.empty(13, 13, dtype=DTYPE)
    got = jvp_launch(rank_raising_sum_kernel, (1,), (x, y, 13), {"BLOCK": 16}, {"x_ptr": tx}, ["y_ptr"])

    def reference(x):
        r = torch.arange(13, dtype=DTYPE)
        return (r[:, None] * 2 + r[None, :]) + torch.sin(x)

    want, want_t = reference_jvp(reference, (x,), (tx,))
    torch.testing.assert_close(got["y_ptr"], (want, want_t), **TOL)


@triton.jit
def row_sums_atomic_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
    tl.atomic_add(total_ptr + cols, tl.exp(x), mask=cols < n)


def test_atomic_add_adds_the_tangent():
    x, tx = randn(6, 29), randn(6, 29)
    total, t_total = torch.zeros(29, dtype=DTYPE), torch.zeros(29, dtype=DTYPE)
    tritongrad.jvp(row_sums_atomic_kernel)[(6,)](x, total, 29, tx, t_total, BLOCK=32)
    want, want_t = reference_jvp(lambda x: torch.exp(x).sum(0), (x,), (tx,))
    torch.testing.assert_close((total, t_total), (want, want_t), **TOL)


# -- refusals, parameters, printing ---------------------------------------------------------------------------


@triton.jit
def cumprod_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols)
    tl.store(y_ptr + cols, tl.cumprod(x, axis=0))  # refused


def test_what_forward_mode_does_not_handle_is_refused_by_name():
    with pytest.raises(NotDifferentiableError, match=r"forward mode does not yet handle `tl\.cumprod`") as e:
        tritongrad.jvp(cumprod_kernel)
    assert e.value.line == unjit(cumprod_kernel).__code__.co_firstlineno + 4
    assert "tl.cumprod" in e.value.source_line


def test_the_tangent_kernel_takes_the_forwards_parameters_then_the_tangents():
    tangent = tritongrad.jvp(rmsnorm.rmsnorm_fwd)
    assert tangent.name == "rmsnorm_fwd_jvp"
    assert tangent.params[-4:] == ("t_x_ptr", "t_w_ptr", "t_y_ptr", "t_rstd_ptr")
    # the text is the point (the calling convention): test_rmsnorm_example_both_outputs checks this kernel's tangents
    assert re.search(r"def rmsnorm_fwd_jvp\(x_ptr, .*, COMPUTE: tl.constexpr, t_x_ptr, t_w_ptr, t_y_ptr, "
                     r"t_rstd_ptr\)", tangent.src)
    assert "# tangent of: y = x * rstd * w" in tangent.src
    assert tritongrad.jvp(rmsnorm.rmsnorm_fwd, wrt=["w_ptr"], outputs=["y_ptr"]).params[-2:] == ("t_w_ptr", "t_y_ptr")


def test_show_jvp_prints_the_tangent_kernel(capsys):
    from tritongrad.tools import cli

    assert cli.main(["show", "flash_attention", "--jvp"]) == 0
    out = capsys.readouterr().out
    assert "def flash_attention_kernel_jvp(q_ptr, k_ptr, v_ptr, o_ptr," in out
    assert "t_q_ptr, t_k_ptr, t_v_ptr, t_o_ptr):" in out
    assert "# tangent of: s = (tl.dot(q, tl.trans(k))" in out
    assert out.count("for start in range(") == 1  # attention's tangent in one pass over the keys
    # the running max only stabilizes (analysis/online.py's proof): no tangent of it, nor of the rescaling by it
    assert "# tangent of: m_new = " not in out and "t_alpha" not in out and "extremum_tangent" not in out


def test_a_tangent_kernel_over_the_shared_memory_at_the_forwards_stages_launches_with_fewer(monkeypatch):
    """A tangent kernel holds its tiles' tangents beside them (an autotuned matmul's config fits its forward, not
    its tangent kernel: out of shared memory on an H200 in float64). Launched with fewer pipeline stages instead,
    which change its speed, not its values: here a kernel that refuses more than one stage, as a GPU would."""
    from triton.runtime.errors import OutOfResources

    found = tritongrad.jvp(elementwise_kernel, wrt=["a_ptr", "b_ptr"], outputs=["y_ptr"])
    stages_tried, kernel, fitting = [], found.kernel, [1]  # (the most stages that fit)

    class OneStageOnly:
        def __getitem__(self, grid):
            def run(**kwargs):
                stages_tried.append(kwargs.get("num_stages"))
                if kwargs.pop("num_stages", 3) > fitting[0]:
                    raise OutOfResources(294912, 232448, "shared memory")
                return kernel[grid](**kwargs)
            return run

    monkeypatch.setattr(found, "kernel", OneStageOnly())
    n = 37
    a, b, s, ta, tb = randn(n), randn(n), randn(1).abs() + 0.5, randn(n), randn(n)
    y, ty = poison(torch.empty(n, dtype=DTYPE)), poison(torch.empty(n, dtype=DTYPE))
    named = found.bind((a, b, s, y, n), {"BLOCK": 16, "t_a_ptr": ta, "t_b_ptr": tb, "t_y_ptr": ty})
    found.launch((triton.cdiv(n, 16),), named, {"num_stages": 4})
    assert stages_tried == [4, 2, 1]
    want, want_t = reference_jvp(elementwise_reference, (a, b, s), (ta, tb, torch.zeros_like(s)))
    torch.testing.assert_close(y, want, **TOL)
    torch.testing.assert_close(ty, want_t, **TOL)
    fitting[0] = 0
    with pytest.raises(OutOfResources):  # (one stage that does not fit either: Triton's error, as it is)
        found.launch((triton.cdiv(n, 16),), named, {"num_stages": 1})
