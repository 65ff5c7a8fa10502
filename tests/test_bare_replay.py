"""A bare op's later calls replayed (the bare op gets the named op's host path): a call of one
segment (segments.py: no PyTorch call read what its launches wrote before the host function returned), its
launches and tensors those of a call learnt before, runs on a replay (host/replay.py), in-place launches' copies
taken per call; anything else falls back to the first call's path. Gradients in float64 against the first call's
(bit for bit) and PyTorch's, counting the calls replayed (test_replay.py's ``replayed``: ``counts``)."""

import inspect

import pytest
import torch
import triton
import triton.language as tl
from test_liger_style import (
    cross_entropy_rows,
    projections,
    rope_case,
    rope_forward,
    rope_in_place,
    rope_reference,
    targets,
)
from test_replay import assert_same, leaves, replayed, step  # noqa: F401 (replayed: a fixture, for `counts`)

import tritongrad
from tritongrad import examples
from tritongrad.host import replay
from tritongrad.ops import autograd_function

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="written for CPU tensors in the interpreter")

F64 = torch.float64


@pytest.fixture
def counts(replayed):  # noqa: F811 (test_replay.py's fixture)
    return replayed


def rope_step(op, leaves_, cos, sin, seed=0):
    q, k = projections(*leaves_)
    got = op(q, k, cos, sin)
    gen = torch.Generator().manual_seed(seed)
    g = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in got]
    return [t.detach().clone() for t in got] + list(torch.autograd.grad(got, leaves_, g))


@pytest.mark.parametrize("host", [rope_forward, rope_in_place], ids=["views-returned", "same-tensors-returned"])
def test_rope_in_place_on_views_of_q_and_k_is_replayed_with_the_first_calls_gradients(host, counts, monkeypatch):
    """Liger's rope as HF calls it: in place on transposed views of the projections, each call on new ones. Its
    backward reads no copy of q and k: a replayed call takes none (it took them, 40 MiB a layer, at first)."""
    op = tritongrad.op(host)
    leaves_, cos, sin = rope_case("cpu")
    first = rope_step(op, leaves_, cos, sin)
    copies = []
    monkeypatch.setattr(replay, "copy_of", lambda t: copies.append(t) or t.clone())
    for _ in range(4):
        assert_same(rope_step(op, leaves_, cos, sin), first)
    assert counts["forward"] >= 3 and counts["backward"] >= 2 and not copies
    want = rope_reference(*projections(*leaves_), cos, sin)
    gen = torch.Generator().manual_seed(0)
    g = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in want]
    for a, b in zip(first, [*want, *torch.autograd.grad(want, leaves_, g)], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_rope_call_of_another_length_falls_back_and_is_right(counts):
    op = tritongrad.op(rope_in_place)
    leaves_, cos, sin = rope_case("cpu")
    for _ in range(3):
        rope_step(op, leaves_, cos, sin)
    x, wq, wk = leaves_
    shorter = [x[:, :4].detach().clone().requires_grad_(), wq, wk]
    q = torch.nn.functional.linear(shorter[0], wq).view(2, 4, 3, 10).transpose(1, 2)
    k = torch.nn.functional.linear(shorter[0], wk).view(2, 4, 1, 10).transpose(1, 2)
    fell = counts["fell"]
    got = op(q, k, cos[:, :4], sin[:, :4])
    assert counts["fell"] == fell + 1
    qk = (torch.nn.functional.linear(shorter[0], w).view(2, 4, -1, 10).transpose(1, 2) for w in (wq, wk))
    want = rope_reference(*qk, cos[:, :4], sin[:, :4])
    g = [torch.randn_like(t) for t in want]
    for a, b in zip(torch.autograd.grad(got, shorter, g), torch.autograd.grad(want, shorter, g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def loss_rows(logits, target):
    """The cross-entropy launched loss-only, as train_hf wraps Liger's: ignored rows' logits zeroed in place, whose
    backward reads the logits as they were (a copy taken per call, before the launch runs)."""
    loss = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    cross_entropy_rows(logits, target, loss, 1, reduction="none")
    return loss


def test_a_cross_entropy_updating_the_logits_in_place_is_replayed_on_copies_of_its_own(counts):
    op = tritongrad.op(loss_rows)
    z = torch.randn(9, 21, dtype=F64, requires_grad=True)
    target = targets(9, 21, "cpu")
    g = torch.randn(9, dtype=F64)

    def run(values):
        z.grad = None
        with torch.no_grad():
            z.copy_(values)
        loss = op(z * 1.0, target)
        loss.backward(g)
        return [loss.detach(), z.grad]

    calls = [torch.randn(9, 21, dtype=F64) for _ in range(5)]
    got = [run(v) for v in calls]
    assert counts["forward"] >= 3 and counts["backward"] >= 2
    for values, found in zip(calls, got, strict=True):
        x = values.clone().requires_grad_()
        rows = torch.nn.functional.cross_entropy(x, target, ignore_index=-100, reduction="none")
        rows.backward(g)
        torch.testing.assert_close(found, [rows.detach(), x.grad], rtol=1e-10, atol=1e-10)


@triton.jit
def square_in_place(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * x, mask=offs < n)


def squared(x, scale):
    square_in_place[(1,)](x, x.numel(), BLOCK=32)
    if scale != 1.0:  # PyTorch reads what the launch wrote: the segment closes there
        x = x * scale
    return x


def test_a_replayed_call_a_pytorch_call_splits_falls_back_with_the_copy_taken_before_its_launch(counts):
    """The replay's launch ran, in place, before the PyTorch call showed the call is of two segments: its launch
    recorded as a first call's keeps the copy taken before it ran (taken again, it would hold x squared: the gradient
    6 x**3 instead of 6 x)."""
    op = tritongrad.op(squared)
    x0 = torch.randn(20, dtype=F64, requires_grad=True)
    for _ in range(3):
        x0.grad = None
        op(x0 * 1.0, 1.0).sum().backward()
        torch.testing.assert_close(x0.grad, 2 * x0.detach())
    fell = counts["fell"]
    x0.grad = None
    y = op(x0 * 1.0, 3.0)
    assert counts["fell"] == fell + 1
    torch.testing.assert_close(y, 3 * x0.detach() ** 2)
    y.sum().backward()
    torch.testing.assert_close(x0.grad, 6 * x0.detach())


def test_a_bare_rmsnorm_is_replayed_with_the_first_calls_gradients(counts):
    example = examples.get("rmsnorm")
    op = tritongrad.op(inspect.unwrap(example.op))
    inputs = example.make_inputs(example.sizes[-1], device="cpu", dtype=F64)
    first = step(op, leaves(inputs))
    for _ in range(4):
        assert_same(step(op, leaves(inputs)), first)
    assert counts["forward"] >= 3 and counts["backward"] >= 2
    want = step(example.reference, leaves(inputs))
    for g, w in zip(first, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_the_reach_check_stops_at_the_arguments_nodes():
    """A bare op's check that its outputs reach its arguments walks back until it has found their nodes, not the
    whole graph behind them (a model's, on every call)."""
    x = torch.randn(5, dtype=F64, requires_grad=True)
    deep = x
    for _ in range(300):
        deep = deep * 1.0
    arg = deep * 2.0
    out = arg * 3.0
    seen = autograd_function._autograd_ancestors([out], {arg.grad_fn})
    assert arg.grad_fn in seen and len(seen) <= 3
    assert len(autograd_function._autograd_ancestors([out], {object()})) > 300  # (not found: the whole graph)


def test_the_reach_check_stops_at_one_node_of_each_argument():
    """An argument updated in place is reached through its node before the call or its base's: the walk stops at
    the first of them it finds, not going on over the graph behind for the other (a model's, on every call)."""
    x = torch.randn(5, dtype=F64, requires_grad=True)
    deep = x
    for _ in range(300):
        deep = deep * 1.0
    arg = deep * 2.0
    out = arg * 3.0
    unreached = torch.randn(5, dtype=F64, requires_grad=True) * 1.0
    seen = autograd_function._autograd_ancestors([out], [(arg.grad_fn, unreached.grad_fn)])
    assert arg.grad_fn in seen and len(seen) <= 3


@pytest.mark.parametrize("host", [rope_forward, rope_in_place], ids=["views-returned", "same-tensors-returned"])
def test_half_precision_rope_in_place_keeps_its_gradients_in_half_precision(host, counts, monkeypatch):
    """q's and k's new values' gradients are copied into their storages' shadows in float16, where the derived
    kernel replaces each with the old values' gradient, written once: no float32 copy of them is made (nor cast
    back after), on the first call's path and on the replay's alike. Gradients against float64 PyTorch."""
    op = tritongrad.op(host)
    leaves64, cos64, sin64 = rope_case("cpu")
    q64, k64 = projections(*leaves64)
    g64 = [torch.randn(t.shape, dtype=F64) for t in (q64, k64)]
    want = torch.autograd.grad(rope_reference(q64, k64, cos64, sin64), (q64, k64), g64)
    made = []
    real_empty = torch.empty

    def spy(*size, **kwargs):
        t = real_empty(*size, **kwargs)
        made.append((t.numel(), t.dtype))
        return t

    sizes = {t.numel() for t in want}
    for call in range(4):  # (the first call's path, its checked backward first, then replays)
        q, k = (t.detach().half().requires_grad_() for t in (q64, k64))
        got = op(q.clone(), k.clone(), cos64.half(), sin64.half())
        made.clear()
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", spy)
            grads = torch.autograd.grad(got, (q, k), [g.half() for g in g64])
        for a, b in zip(grads, want, strict=True):
            torch.testing.assert_close(a.double(), b, rtol=2e-3, atol=2e-3 * b.abs().max().item())
        if call > 0:
            assert not [m for m in made if m[0] in sizes and m[1] == torch.float32], made
    assert counts["backward"] >= 2
