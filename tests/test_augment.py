"""The augmented forward (augment.py): an op's forward keeps its nonlinear loops' states for the backward.

Each kernel through a `tritongrad.op` against a plain-PyTorch reference and torch autograd: float64, sizes
not powers of two, random upstream gradients, NaN-poisoned outputs and tapes (a slot the forward forgot to
keep reads NaN). A loop in a helper is kept through a copy of the helper per call. Where the forward cannot keep
the tapes (a loop inside another loop, a trip count read from memory, tapes too big), the backward records them
itself: still right.
"""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad
from tritongrad.examples import cross_entropy as ce
from tritongrad.runtime import augment, derive
from tritongrad.tools.testing import backward_launch, forward_keeping_state, poison

F64 = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


@pytest.fixture(autouse=True)
def poisoned_tapes(monkeypatch):
    """Tape buffers (raw bytes) come back all ones: a float64 NaN in every slot nothing wrote."""
    empty = torch.empty

    def filled(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(255) if t.dtype == torch.uint8 else t

    monkeypatch.setattr(torch, "empty", filled)


@pytest.fixture
def launches(monkeypatch):
    """Each derived backward's launch: the saved tapes it was given, and the variant it ran."""
    seen = []
    real = derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, written=frozenset(), pad=0, saved=None,
            **kwargs):
        reads = saved is not None and any(part.saved for part in prepared.variant.parts)
        used = prepared.variant if reads else None
        seen.append((saved, used))
        return real(self, grid, named, output_grads, buffers, prepared, written, pad, saved, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    return seen


def gradients_of(op, reference, inputs, wrt):
    """The op's outputs and gradients against the reference's, for one random upstream gradient."""
    leaves = [inputs[i].clone().requires_grad_() for i in wrt]
    args = list(inputs)
    for i, leaf in zip(wrt, leaves, strict=True):
        args[i] = leaf
    out = op(*args)
    twins = [inputs[i].clone().requires_grad_() for i in wrt]
    ref_args = list(inputs)
    for i, leaf in zip(wrt, twins, strict=True):
        ref_args[i] = leaf
    want = reference(*ref_args)
    torch.testing.assert_close(out, want.detach(), **TOL)
    g = torch.randn_like(want)
    got = torch.autograd.grad(out, leaves, g)
    expected = torch.autograd.grad(want, twins, g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    return out, got


# -- an online log-sum-exp: the cross-entropy example -------------------------------------------------


def test_cross_entropy_backward_reads_the_state_its_forward_kept(launches):
    torch.manual_seed(0)
    logits, target, ignore = ce.make_inputs((7, 101), device=DEVICE, dtype=F64)  # 4 blocks of 32; two rows ignored
    gradients_of(ce.cross_entropy, ce.reference, (logits, target, ignore), wrt=(0,))
    ((saved, used),) = launches
    assert saved is not None and used is not None
    src = used.src
    assert "tape_put" not in src  # no recording pass: the forward kept the final max and sum
    assert "m_max = tg.tape_get(" in src and "s = tg.tape_get(" in src
    assert src.count("load = tl.load(logits_ptr + row * stride + cols") == 1  # read once: in the reverse loop


def test_kept_and_recorded_states_give_the_same_gradient(monkeypatch):
    torch.manual_seed(1)
    logits, target, ignore = ce.make_inputs((5, 250), device=DEVICE, dtype=F64)
    _, kept = gradients_of(ce.cross_entropy, ce.reference, (logits, target, ignore), wrt=(0,))
    monkeypatch.setattr(augment, "ENABLED", False)
    augment.clear_cache()
    try:
        torch.manual_seed(1)
        logits, target, ignore = ce.make_inputs((5, 250), device=DEVICE, dtype=F64)  # and the same upstream gradient
        _, recorded = gradients_of(ce.cross_entropy, ce.reference, (logits, target, ignore), wrt=(0,))
    finally:
        augment.clear_cache()
    torch.testing.assert_close(kept[0], recorded[0], rtol=1e-14, atol=1e-14)


def test_the_augmented_forward_writes_what_the_kernel_writes():
    torch.manual_seed(2)
    logits, target, ignore = ce.make_inputs((6, 101), device=DEVICE, dtype=F64)
    launch = ce.cross_entropy_launch(logits, target, ignore)
    ce.cross_entropy_kernel[launch.grid](*launch.args, **launch.kwargs)
    first = launch.out.clone()
    poison(launch.out)
    saved = forward_keeping_state(ce.cross_entropy_kernel, launch.grid, launch.args, launch.kwargs)
    assert saved is not None
    assert torch.equal(launch.out, first)
    d_loss = torch.randn_like(first)
    kept = backward_launch(ce.cross_entropy_kernel, launch.grid, launch.args, launch.kwargs, {"loss_ptr": d_loss},
                           saved=saved)
    recorded = backward_launch(ce.cross_entropy_kernel, launch.grid, launch.args, launch.kwargs,
                               {"loss_ptr": d_loss})
    torch.testing.assert_close(kept["logits_ptr"], recorded["logits_ptr"], rtol=1e-14, atol=1e-14)


# -- a nonlinear recurrence, and an accumulator beside it -----------------------------------------------


@triton.jit
def recurrence_kernel(x_ptr, y_ptr, T, N, BLOCK: tl.constexpr):
    """h <- sigmoid(h) * x_t + h / 2 over T steps per row, and the sum of the x_t: y = h * total."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    h = tl.zeros((BLOCK,), dtype=tl.float64) + 0.25
    total = tl.zeros((BLOCK,), dtype=tl.float64)
    for t in range(0, T):
        x = tl.load(x_ptr + (row * T + t) * N + cols, mask=mask, other=0.0)
        h = tl.sigmoid(h) * x + h * 0.5
        total += x
    tl.store(y_ptr + row * N + cols, h * total, mask=mask)


def recurrence_reference(x):
    h = torch.full_like(x[:, 0], 0.25)
    for t in range(x.shape[1]):
        h = torch.sigmoid(h) * x[:, t] + h * 0.5
    return h * x.sum(1)


@tritongrad.op
def recurrence(x):
    rows, steps, n = x.shape
    y = torch.empty(rows, n, dtype=x.dtype)
    recurrence_kernel[(rows,)](x, y, steps, n, BLOCK=triton.next_power_of_2(n))
    return y


def test_a_recurrence_and_an_accumulator_needed_after_the_loop(launches, monkeypatch):
    monkeypatch.setattr(augment, "SHARE", float("inf"))  # (a tile per step, on small tensors: bigger than SHARE)
    torch.manual_seed(3)
    x = torch.randn(3, 6, 19, dtype=F64)
    gradients_of(recurrence, recurrence_reference, (x,), wrt=(0,))
    ((saved, used),) = launches
    assert saved is not None and used is not None
    # the final `total` is not on the tape: the loop is recomputed for it (no recording), then reversed
    assert "tape_put" not in used.src and "for t in range(0, T)" in used.src


def test_tapes_too_big_to_keep_are_recorded_by_the_backward(launches, monkeypatch):
    monkeypatch.setattr(augment, "SHARE", 0.01)
    torch.manual_seed(4)
    gradients_of(recurrence, recurrence_reference, (torch.randn(2, 5, 13, dtype=F64),), wrt=(0,))
    ((saved, used),) = launches
    assert saved is None


# -- where the forward cannot keep them --------------------------------------------------------------


@triton.jit
def _running_lse(x_ptr, T, N, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float64)
    s = tl.zeros((), dtype=tl.float64)
    for t in range(0, T, BLOCK):
        x = tl.load(x_ptr + t + cols, mask=t + cols < T, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    return m + tl.log(s)


@triton.jit
def lse_in_helper_kernel(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    tl.store(y_ptr + row, _running_lse(x_ptr + row * T, T, 0, BLOCK))


@triton.jit
def lse_of_chunks_kernel(x_ptr, y_ptr, T, CHUNKS, BLOCK: tl.constexpr):
    """Per row, the sum over chunks of each chunk's log-sum-exp: the online loop inside another loop."""
    row = tl.program_id(0)
    total = tl.zeros((), dtype=tl.float64)
    cols = tl.arange(0, BLOCK)
    for c in range(CHUNKS):
        m = tl.full((), float("-inf"), tl.float64)
        s = tl.zeros((), dtype=tl.float64)
        for t in range(0, T, BLOCK):
            x = tl.load(x_ptr + (row * CHUNKS + c) * T + t + cols, mask=t + cols < T, other=float("-inf"))
            m_new = tl.maximum(m, tl.max(x))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
            m = m_new
        total += m + tl.log(s)
    tl.store(y_ptr + row, total)


@triton.jit
def lse_of_loaded_length_kernel(x_ptr, n_ptr, y_ptr, stride, BLOCK: tl.constexpr):
    """The online loop over a length read from memory: its trip count is not known at launch."""
    row = tl.program_id(0)
    n = tl.load(n_ptr + row)
    cols = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float64)
    s = tl.zeros((), dtype=tl.float64)
    for t in range(0, n, BLOCK):
        x = tl.load(x_ptr + row * stride + t + cols, mask=t + cols < n, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    tl.store(y_ptr + row, m + tl.log(s))


@triton.jit
def lse_twice_in_one_statement_kernel(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    """Two calls of the helper that one line holds: which loop is which call is not known there."""
    row = tl.program_id(0)
    tl.store(y_ptr + row, _running_lse(x_ptr + row * T, T // 2, 0, BLOCK) - _running_lse(x_ptr + row * T + T // 2,
                                                                                         T - T // 2, 0, BLOCK))


@tritongrad.op
def lse_twice_in_one_statement(x):
    y = torch.empty(x.shape[0], dtype=x.dtype)
    lse_twice_in_one_statement_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=16)
    return y


@tritongrad.op
def lse_in_helper(x):
    y = torch.empty(x.shape[0], dtype=x.dtype)
    lse_in_helper_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=16)
    return y


@tritongrad.op
def lse_of_chunks(x):
    rows, chunks, t = x.shape
    y = torch.empty(rows, dtype=x.dtype)
    lse_of_chunks_kernel[(rows,)](x, y, t, chunks, BLOCK=16)
    return y


@tritongrad.op
def lse_of_loaded_length(x, n):
    y = torch.empty(x.shape[0], dtype=x.dtype)
    lse_of_loaded_length_kernel[(x.shape[0],)](x, n, y, x.stride(0), BLOCK=16)
    return y


def test_an_online_loop_in_a_helper_is_kept_by_the_forward(launches):
    """The loop is the helper's: the forward runs a copy of the helper that keeps the final max and sum."""
    torch.manual_seed(5)
    x = torch.randn(4, 45, dtype=F64)
    gradients_of(lse_in_helper, lambda x: torch.logsumexp(x, 1), (x,), wrt=(0,))
    ((saved, used),) = launches
    assert saved is not None and used is not None and "tape_put" not in used.src
    (tape,) = saved.tapes
    assert tape.loop.function == "_running_lse" and [c.function for c in tape.loop.calls] == ["lse_in_helper_kernel"]


def test_two_calls_of_a_helper_in_one_statement_are_taped_by_the_backward(launches):
    torch.manual_seed(9)
    x = torch.randn(3, 45, dtype=F64)
    gradients_of(lse_twice_in_one_statement,
                 lambda x: torch.logsumexp(x[:, :22], 1) - torch.logsumexp(x[:, 22:], 1), (x,), wrt=(0,))
    assert [saved for saved, _ in launches] == [None]


@triton.jit
def _recur(x_ptr, h, row, t0, t1, T, N, cols, mask):
    for t in range(t0, t1):
        x = tl.load(x_ptr + (row * T + t) * N + cols, mask=mask, other=0.0)
        h = tl.sigmoid(h) * x + h * 0.5
    return h


@triton.jit
def _two_stretches(x_ptr, h, row, SPLIT, T, N, cols, mask):
    h = _recur(x_ptr, h, row, 0, SPLIT, T, N, cols, mask)
    h = h * 0.75
    return _recur(x_ptr, h, row, SPLIT, T, T, N, cols, mask)


@triton.jit
def recurrence_in_helpers_kernel(x_ptr, y_ptr, T, SPLIT, N, BLOCK: tl.constexpr):
    """The recurrence in a helper, called twice by another helper: two loops, a state tape each."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    h = tl.zeros((BLOCK,), dtype=tl.float64) + 0.25
    tl.store(y_ptr + row * N + cols, _two_stretches(x_ptr, h, row, SPLIT, T, N, cols, mask), mask=mask)


@triton.jit
def recurrence_in_a_loop_kernel(x_ptr, y_ptr, T, SPLIT, N, BLOCK: tl.constexpr):
    """The helper's loop inside the kernel's: its state is not kept (one row per program, not per call)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    h = tl.zeros((BLOCK,), dtype=tl.float64) + 0.25
    for part in range(2):
        h = _recur(x_ptr, h, row, part * SPLIT, part * SPLIT + SPLIT, T, N, cols, mask) * 0.75
    tl.store(y_ptr + row * N + cols, h, mask=mask)


def two_stretches_reference(x, split):
    h = torch.full_like(x[:, 0], 0.25)
    for t in range(x.shape[1]):
        h = (h * 0.75 if t == split else h)
        h = torch.sigmoid(h) * x[:, t] + h * 0.5
    return h


@pytest.mark.parametrize("kernel", [recurrence_in_helpers_kernel, recurrence_in_a_loop_kernel])
def test_a_recurrence_in_a_helper_called_twice(kernel, launches, monkeypatch):
    monkeypatch.setattr(augment, "SHARE", float("inf"))  # (a tile per step, on small tensors: bigger than SHARE)
    torch.manual_seed(8)
    split = 5

    @tritongrad.op
    def stretches(x):
        rows, steps, n = x.shape
        y = torch.empty(rows, n, dtype=x.dtype)
        kernel[(rows,)](x, y, steps, split, n, BLOCK=triton.next_power_of_2(n))
        return y

    x = torch.randn(3, 2 * split, 19, dtype=F64)
    reference = two_stretches_reference if kernel is recurrence_in_helpers_kernel else (
        lambda x, split: two_stretches_reference(x, split) * 0.75)
    gradients_of(stretches, lambda x: reference(x, split), (x,), wrt=(0,))
    ((saved, used),) = launches
    if kernel is recurrence_in_a_loop_kernel:
        assert saved is None  # the backward records its tapes
        return
    assert saved is not None and used is not None and "tape_put" not in used.src
    calls = [tape.loop.calls for tape in saved.tapes]  # a tape per call of the helper, each with its own path
    assert len(calls) == 2 and calls[0][:1] == calls[1][:1] and calls[0][1].line != calls[1][1].line


def test_an_online_loop_inside_another_loop_is_taped_by_the_backward(launches):
    torch.manual_seed(6)
    x = torch.randn(3, 2, 37, dtype=F64)
    gradients_of(lse_of_chunks, lambda x: torch.logsumexp(x, 2).sum(1), (x,), wrt=(0,))
    assert [saved for saved, _ in launches] == [None]


def test_a_trip_count_read_from_memory_does_not_stop_the_forward_keeping_the_final_max_and_sum(launches):
    torch.manual_seed(7)
    x = torch.randn(3, 50, dtype=F64)
    n = torch.tensor([50, 17, 33])

    def reference(x, n):
        return torch.stack([torch.logsumexp(x[i, :k], 0) for i, k in enumerate(n.tolist())])

    gradients_of(lse_of_loaded_length, reference, (x, n), wrt=(0,))
    ((saved, used),) = launches  # an online log-sum-exp: its finals take one slot whatever the trip count
    assert saved is not None and used is not None and all(tape.final for tape in saved.tapes)
