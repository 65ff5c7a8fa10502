"""Showcase kernels: flash attention (online softmax over key blocks) and cross-entropy
over a vocabulary of several blocks with ignored targets. Float64, lengths that are not multiples
of the blocks, NaN-poisoned outputs, random upstream gradients."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.examples import cross_entropy, flash_attention
from tritongrad.reverse import interchange
from tritongrad.runtime import backward_kernel, derive, launching, tuning
from tritongrad.tools.testing import backward_launch, forward_keeping_state, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}
ROOT = Path(__file__).resolve().parents[1]


def test_flash_attention_gradients_for_q_k_and_v(device):
    # several heads, one block, a partial block; causal and not
    for heads, n, d, causal in [(2, 37, 12, True), (1, 16, 16, True), (3, 5, 7, False), (1, 45, 12, False)]:
        q, k, v = (torch.randn(heads, n, d, device=device, dtype=DTYPE) for _ in range(3))
        launch = flash_attention.flash_attention_launch(q, k, v, causal)
        poison(launch.out)
        out = launch()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        want = flash_attention.reference(*leaves, causal)
        torch.testing.assert_close(out, want.detach(), **TOL)
        d_o = torch.randn_like(out)
        got = backward_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"o_ptr": d_o})
        wanted = torch.autograd.grad(want, leaves, d_o)
        for name, w in zip(("q_ptr", "k_ptr", "v_ptr"), wanted, strict=True):
            torch.testing.assert_close(got[name], w, **TOL,
                                       msg=lambda msg, p=name, size=(heads, n, d, causal): f"d_{p} {size}: {msg}")


def test_dk_and_dv_get_one_kernel_of_their_own_where_the_forward_keeps_the_finals(monkeypatch):
    """With the final max, sum and accumulator the forward kept, dK and dV are summed by one kernel whose programs
    are key blocks, each looping over the query blocks (FlashAttention-2's backward, with its preprocessing
    kernel: interchange.Prologue); causal: the query blocks
    whose loop stops before the key block skip it. Without them (the backward alone) one kernel, as before."""
    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)  # a few key blocks: kernels of their own
    launched = []
    real = derive.BackwardKernel.launch
    monkeypatch.setattr(derive.BackwardKernel, "launch", lambda self, grid, named, og, buffers, prepared, *a, **k: (
        launched.append(prepared.variant), real(self, grid, named, og, buffers, prepared, *a, **k))[1])
    for heads, n, d, causal in [(2, 45, 12, True), (1, 37, 16, False)]:
        q, k, v = (torch.randn(heads, n, d, dtype=DTYPE) for _ in range(3))
        launch = flash_attention.flash_attention_launch(q, k, v, causal)
        poison(launch.out)
        saved = forward_keeping_state(launch.kernel, launch.grid, launch.args, launch.kwargs)
        assert saved is not None and {s for t in saved.tapes for s in t.sources} == {"m_i", "l_i", "acc"}
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        want = flash_attention.reference(*leaves, causal)
        torch.testing.assert_close(launch.out, want.detach(), **TOL)
        d_o = torch.randn_like(launch.out)
        wanted = torch.autograd.grad(want, leaves, d_o)
        for kept in (saved, None):
            got = backward_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"o_ptr": d_o}, saved=kept)
            for name, w in zip(("q_ptr", "k_ptr", "v_ptr"), wanted, strict=True):
                torch.testing.assert_close(got[name], w, **TOL)
        with_finals, alone = launched[-2:]
        assert [p.wrt for p in with_finals.parts] == [("q_ptr",), ("k_ptr", "v_ptr")]
        assert all(p.saved for p in with_finals.parts) and "atomic" not in with_finals.src
        own = with_finals.parts[1].src
        assert "start_iteration = tl.program_id(0)" in own and "acc = tg.tape_get(" in own
        # dO / l and the row sums of dO * o: computed once per query block by a prologue, read by each key block
        assert with_finals.parts[1].prologue is not None
        assert "def flash_attention_kernel_bwd_k_ptr_v_ptr_prologue(" in own
        assert "d_acc = tg.tape_get(d_acc_row" in own and "d_l_i = tg.tape_get(d_l_i_row" in own
        # dO / l is only read rounded to v's type (for dV's and dP's products): kept so, half the bytes in bf16
        assert "tg.tape_put_exactly(d_acc_row, d_acc.to(v_ptr.dtype.element_ty)" in own
        assert "tg.tape_put_exactly(d_l_i_row, d_l_i, tg.zeros_grad(" in own  # (summed with float32 values)
        assert ("if start_iteration < start_trips:" in own) == causal
        # S, P, dP, dS computed transposed (orient.py): dK's and dV's products read them as they are
        assert "dot_q = tl.dot(k, tl.trans(q))" in own and "d_k = tl.dot(d_dot_q.to(q.dtype), q)" in own
        assert "d_v = tl.dot(to_p, d_dot_to_p.to(to_p.dtype))" in own and "(orient.py)" in own
        assert [(p.wrt, p.saved) for p in alone.parts] == [(("q_ptr", "k_ptr", "v_ptr"), False)]


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
def test_do_over_l_kept_rounded_gives_the_same_bits(monkeypatch):
    """In float16 (the interpreter has no bf16), the prologue keeps dO / l as v's type: the gradients are bit for
    bit those of the backward keeping it in float32 (both of its uses round it to v's type first)."""
    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    monkeypatch.setenv("TRITONGRAD_TUNE", "0")  # (compiled, a tuner may give either other warps: another sum order)
    q, k, v = (torch.randn(2, 45, 16, dtype=torch.float16) for _ in range(3))
    launch = flash_attention.flash_attention_launch(q, k, v, True)
    poison(launch.out)
    saved = forward_keeping_state(launch.kernel, launch.grid, launch.args, launch.kwargs)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    want = flash_attention.reference(*leaves, True)
    torch.testing.assert_close(launch.out.double(), want.detach(), rtol=1e-2, atol=1e-2)
    d_o = torch.randn_like(launch.out)
    sources = []
    real = derive.BackwardKernel.launch
    monkeypatch.setattr(derive.BackwardKernel, "launch", lambda self, grid, named, og, buffers, prepared, *a, **k: (
        sources.append(prepared.variant.src), real(self, grid, named, og, buffers, prepared, *a, **k))[1])
    got = {}
    for rounded in (True, False):
        derive.clear_cache()
        if not rounded:
            monkeypatch.setattr(interchange, "_rounded_to", lambda *args: None)
        got[rounded] = backward_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"o_ptr": d_o},
                                       saved=saved)
    derive.clear_cache()
    assert [".to(v_ptr.dtype.element_ty)" in src for src in sources] == [True, False]
    for name in ("q_ptr", "k_ptr", "v_ptr"):
        assert torch.equal(got[True][name], got[False][name]), name
    wanted = torch.autograd.grad(want, leaves, d_o.double())
    for name, w in zip(("q_ptr", "k_ptr", "v_ptr"), wanted, strict=True):
        torch.testing.assert_close(got[True][name].double(), w, rtol=2e-2, atol=2e-2)


def test_each_kernel_of_a_variant_is_tuned_on_its_own(monkeypatch):
    """The dQ kernel and the dK/dV kernel get a launch setting each, timed with only their own kernel
    launched (tuning.best is given one trial per kernel); the gradients under those settings are right."""
    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    monkeypatch.setattr(tuning, "enabled", lambda device: True)
    ran, timed = [], []
    for method in ("run_part", "run_interchanged"):
        real = getattr(launching.Launches, method)
        monkeypatch.setattr(launching.Launches, method, lambda self, part, grid, args, *a, real=real, **k: (
            ran.append((part.wrt, args.get("num_stages"))), real(self, part, grid, args, *a, **k))[1])

    def best(key, persistent, trial, touched, pipelined, holds, taped):
        ran.clear()
        trial(tuning.DEFAULT)
        timed.append((key[-1], tuple(ran), pipelined))
        return tuning.Setting(num_stages=2 + key[-1])  # (the interpreter ignores it)

    monkeypatch.setattr(tuning, "best", best)
    q, k, v = (torch.randn(3, 29, 12, dtype=DTYPE) for _ in range(3))  # a launch no other test prepared
    launch = flash_attention.flash_attention_launch(q, k, v, True)
    poison(launch.out)
    saved = forward_keeping_state(launch.kernel, launch.grid, launch.args, launch.kwargs)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = flash_attention.reference(*leaves, True)
    torch.testing.assert_close(launch.out, want.detach(), **TOL)
    d_o = torch.randn_like(launch.out)
    wanted = torch.autograd.grad(want, leaves, d_o)
    got = backward_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"o_ptr": d_o}, saved=saved)
    assert timed == [(0, ((("q_ptr",), None),), True), (1, ((("k_ptr", "v_ptr"), None),), True)]
    assert ran[-2:] == [(("q_ptr",), 2), (("k_ptr", "v_ptr"), 3)]  # each launched with its own setting
    for name, w in zip(("q_ptr", "k_ptr", "v_ptr"), wanted, strict=True):
        torch.testing.assert_close(got[name], w, **TOL)


@pytest.mark.slow  # (about 3 s: every variant shown)
def test_show_names_the_flash_attention_loop_strategy():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    spec = "tritongrad/examples/flash_attention.py:flash_attention_kernel"
    result = subprocess.run([sys.executable, "-m", "tritongrad", "show", spec], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    derived, kept = result.stdout.split("# Through a tritongrad.op")
    # the text is the point (what `show` says): test_flash_attention_gradients_for_q_k_and_v and
    # test_dk_and_dv_get_one_kernel_of_their_own_where_the_forward_keeps_the_finals check both kernels' gradients
    assert "# online softmax: the running max m_i only stabilizes" in derived, result.stdout
    assert "# loop over start: l_i, acc are accumulated linearly" in derived
    assert "tape_put" not in derived and "quadratic" not in result.stdout
    assert "to_p = tg.to_float(p, v.dtype)" in derived  # a cast of rescaled values: checked to be to a float type
    # the forward keeps the final max, sum and accumulator; the backward reads them instead of the two passes
    assert "m_i_max = tg.tape_get(" in kept and "acc = tg.tape_get(" in kept and "start_max in range" not in kept


def test_cross_entropy_with_ignored_targets(device):
    logits, target, _ = cross_entropy.make_inputs(device=device, dtype=DTYPE)
    target[0] = logits.shape[1] - 1  # the last column, in the partial last block
    launch = cross_entropy.cross_entropy_launch(logits, target)
    poison(launch.out)
    loss = launch()
    leaf = logits.clone().requires_grad_()
    want = cross_entropy.reference(leaf, target)
    torch.testing.assert_close(loss, want.detach(), **TOL)
    ignored = target == cross_entropy.IGNORE_INDEX
    assert ignored.sum() == 2 and (loss[ignored] == 0).all()
    d_loss = torch.randn_like(loss)
    got = backward_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {"loss_ptr": d_loss})
    assert tuple(got) == ("logits_ptr",), "the targets are indices: no gradient"
    (wanted,) = torch.autograd.grad(want, leaf, d_loss)
    torch.testing.assert_close(got["logits_ptr"], wanted, **TOL)
    assert (got["logits_ptr"][ignored] == 0).all(), "an ignored row contributes no gradient"
    src = tritongrad.grad(cross_entropy.cross_entropy_kernel).src
    assert "# online softmax: the running max m only stabilizes" in src, src


# A non-causal backward as fast however the causal bound is written. Triton compiles one kernel per
# constexpr value; the derivation specializes the same way (frontend/specialize.py), so the three writings below
# derive one backward for CAUSAL=False.
@triton.jit
def _attention_range(q_ptr, k_ptr, v_ptr, o_ptr, N, D, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                     CAUSAL: tl.constexpr):  # (no causal form: the loop runs over every key block)
    rm, rd, q, m_i, l_i, acc = _attention_start(q_ptr, N, D, BM, BD)
    for start in range(0, N, BN):
        m_i, l_i, acc = _attention_step(k_ptr, v_ptr, N, D, q, rm, rd, start, m_i, l_i, acc, BN, CAUSAL)
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], acc / l_i[:, None], mask=(rm[:, None] < N) & (rd[None, :] < D))


@triton.jit
def _attention_bound_expression(q_ptr, k_ptr, v_ptr, o_ptr, N, D, BM: tl.constexpr, BN: tl.constexpr,
                                BD: tl.constexpr, CAUSAL: tl.constexpr):
    rm, rd, q, m_i, l_i, acc = _attention_start(q_ptr, N, D, BM, BD)
    hi = tl.minimum((tl.program_id(0) + 1) * BM, N) if CAUSAL else N
    for start in range(0, hi, BN):
        m_i, l_i, acc = _attention_step(k_ptr, v_ptr, N, D, q, rm, rd, start, m_i, l_i, acc, BN, CAUSAL)
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], acc / l_i[:, None], mask=(rm[:, None] < N) & (rd[None, :] < D))


@triton.jit
def _attention_bound_branch(q_ptr, k_ptr, v_ptr, o_ptr, N, D, BM: tl.constexpr, BN: tl.constexpr,
                            BD: tl.constexpr, CAUSAL: tl.constexpr):
    rm, rd, q, m_i, l_i, acc = _attention_start(q_ptr, N, D, BM, BD)
    hi = N
    if CAUSAL:
        hi = tl.minimum((tl.program_id(0) + 1) * BM, N)
    for start in range(0, hi, BN):
        m_i, l_i, acc = _attention_step(k_ptr, v_ptr, N, D, q, rm, rd, start, m_i, l_i, acc, BN, CAUSAL)
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], acc / l_i[:, None], mask=(rm[:, None] < N) & (rd[None, :] < D))


@triton.jit
def _attention_start(q_ptr, N, D, BM: tl.constexpr, BD: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q = tl.load(q_ptr + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < N) & (rd[None, :] < D), other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float64)
    return rm, rd, q, m_i, tl.zeros([BM], tl.float64), tl.zeros([BM, BD], tl.float64)


@triton.jit
def _attention_step(k_ptr, v_ptr, N, D, q, rm, rd, start, m_i, l_i, acc, BN: tl.constexpr, CAUSAL: tl.constexpr):
    rn = start + tl.arange(0, BN)
    kv_mask = (rn[:, None] < N) & (rd[None, :] < D)
    k = tl.load(k_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k)) * 0.3
    visible = rn[None, :] < N
    if CAUSAL:
        visible = visible & (rn[None, :] <= rm[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tl.dot(p, v)


@pytest.mark.slow  # (~10 s: six spellings derived and run)
def test_the_causal_bound_written_any_way_derives_one_non_causal_backward(monkeypatch):
    """The bound as `range(0, N, BN)`, as a conditional expression on CAUSAL, and as an `if CAUSAL:` assignment:
    with CAUSAL=False the three launches choose the same variant with the same kernels, names aside; with
    CAUSAL=True the two causal forms get PyTorch's gradients (float64, 45 queries: a partial block)."""
    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    variants = []
    real = derive.BackwardKernel.launch
    monkeypatch.setattr(derive.BackwardKernel, "launch", lambda self, grid, named, og, buffers, prepared, *a, **k: (
        variants.append(prepared.variant), real(self, grid, named, og, buffers, prepared, *a, **k))[1])
    n, d = 45, 16
    q, k, v = (torch.randn(n, d, dtype=DTYPE) for _ in range(3))
    d_o = torch.randn(n, d, dtype=DTYPE)
    sources = {}
    for kernel in (_attention_range, _attention_bound_expression, _attention_bound_branch):
        for causal in (False, True) if kernel is not _attention_range else (False,):
            o = poison(torch.empty(n, d, dtype=DTYPE))
            args = (q, k, v, o, n, d)
            kwargs = {"BM": 16, "BN": 16, "BD": 16, "CAUSAL": causal}
            grid = (triton.cdiv(n, 16),)
            saved = forward_keeping_state(kernel, grid, args, kwargs)
            assert saved is not None
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            scores = (leaves[0] @ leaves[1].T) * 0.3
            if causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            want = torch.softmax(scores, -1) @ leaves[2]
            torch.testing.assert_close(o, want.detach(), **TOL)
            got = backward_launch(kernel, grid, args, kwargs, {"o_ptr": d_o}, saved=saved)
            for name, w in zip(("q_ptr", "k_ptr", "v_ptr"), torch.autograd.grad(want, leaves, d_o), strict=True):
                torch.testing.assert_close(got[name], w, **TOL, msg=lambda m, p=f"{kernel.fn.__name__} d_{name}": p + m)
            if not causal:  # (the bound's name, `hi = N`, is all that is left of the causal forms)
                src = re.sub(r"\n *hi = N\n", "\n", variants[-1].src.replace(kernel.fn.__name__, "attention"))
                sources[kernel.fn.__name__] = re.sub(r"\bhi\b", "N", src)
    assert len(set(sources.values())) == 1, sorted(sources)
