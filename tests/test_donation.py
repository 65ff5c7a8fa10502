"""Storage donation (host/donation.py): an input's gradient written over the input's own memory where only the op's
node still holds it, its derived kernel updating it in place; allocated as before wherever anything else could read
the input, the graph is kept or a graph of the backward is built."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.examples import cross_entropy, swiglu
from tritongrad.host import donation


@pytest.fixture(autouse=True)
def _small_buffers_donate(monkeypatch):
    """These tests' tensors are small: donation is considered for every size here (DONATE_AT_LEAST)."""
    monkeypatch.setattr(donation, "DONATE_AT_LEAST", 0)


# the first backward of a plan is checked (guard bands: never donated); then PlannedBackward, then kept launches
CALLS = 4

bare_cross_entropy = tritongrad.op(lambda logits, target: cross_entropy.cross_entropy_launch(logits, target)())
OPS = {"named": cross_entropy.cross_entropy, "bare": bare_cross_entropy}
bare_swiglu = tritongrad.op(lambda a, b: swiglu.swiglu_launch(a.contiguous(), b.contiguous())())


def _inputs(device, rows=13, vocab=101):
    logits = (3 * torch.randn(rows, vocab, device=device, dtype=torch.float64)).requires_grad_(True)
    target = torch.randint(0, vocab, (rows,), device=device)
    target[1::5] = cross_entropy.IGNORE_INDEX
    return logits, target


def _call(op, logits, target):
    return op(logits, target) if op is bare_cross_entropy else op(logits, target, cross_entropy.IGNORE_INDEX)


def _made_inside(op, leaf, target, seen):
    """The op called on a tensor made for it and dropped (as a loss function's ``logits.float()``): its gradient
    caught on its way back, and where the tensor's memory was."""
    made = leaf * 1.0
    made.register_hook(lambda g: seen.append(g))
    where = made.data_ptr()
    loss = _call(op, made, target)
    del made
    return loss, where


@pytest.mark.parametrize("kind", OPS)
def test_a_dropped_input_takes_its_gradient_in_its_own_memory(kind, device):
    op = OPS[kind]
    leaf, target = _inputs(device)
    for i in range(CALLS):
        seen = []
        loss, where = _made_inside(op, leaf, target, seen)
        g = torch.randn_like(loss)
        (got,) = torch.autograd.grad(loss, leaf, g)
        (expected,) = torch.autograd.grad(cross_entropy.reference(leaf, target), leaf, g)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        assert seen[0].data_ptr() == where or i == 0, i  # donated but in the first (checked) backward of a plan


def test_a_buffer_under_the_threshold_is_not_donated(device, monkeypatch):
    """Donation's check costs seconds once per kind of call: a buffer under DONATE_AT_LEAST is not worth it."""
    monkeypatch.setattr(donation, "DONATE_AT_LEAST", 7 * 59 * 8 + 1)  # one byte more than the logits
    packed = []
    pack = donation._pack
    monkeypatch.setattr(donation, "_pack", lambda t: packed.append(t) or pack(t))
    leaf, target = _inputs(device, rows=7, vocab=59)  # (a kind of call no other test made: decided afresh)
    before = donation.taken
    for _ in range(CALLS):
        loss, _ = _made_inside(OPS["named"], leaf, target, [])
        g = torch.randn_like(loss)
        (got,) = torch.autograd.grad(loss, leaf, g)
        (expected,) = torch.autograd.grad(cross_entropy.reference(leaf, target), leaf, g)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert donation.taken == before
    assert not packed  # (nor saved through donation's hooks: decided once per plan)


@pytest.mark.parametrize("kind", OPS)
def test_an_input_the_caller_holds_is_not_written(kind, device):
    op = OPS[kind]
    leaf, target = _inputs(device)
    for _ in range(CALLS):
        made = leaf * 1.0
        before = made.clone()
        loss = _call(op, made, target)
        g = torch.randn_like(loss)
        (got,) = torch.autograd.grad(loss, made, g)
        assert got.data_ptr() != made.data_ptr()
        assert torch.equal(made, before)  # its values untouched
        (expected,) = torch.autograd.grad(cross_entropy.reference(made, target), made, g)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", OPS)
def test_a_view_of_the_input_held_keeps_it_from_being_written(kind, device):
    op = OPS[kind]
    leaf, target = _inputs(device)
    for _ in range(CALLS):
        made = leaf * 1.0
        row = made[2]  # (a view: another holder of the memory)
        before = row.clone()
        seen = []
        made.register_hook(lambda g, seen=seen: seen.append(g))
        where = made.data_ptr()
        loss = _call(op, made, target)
        del made
        loss.sum().backward()
        assert seen[0].data_ptr() != where and torch.equal(row, before)


@pytest.mark.parametrize("kind", OPS)
def test_retain_graph_keeps_the_input_and_a_second_backward_is_right(kind, device):
    op = OPS[kind]
    leaf, target = _inputs(device)
    for _ in range(CALLS):
        seen = []
        loss, where = _made_inside(op, leaf, target, seen)
        g = torch.randn_like(loss)
        (first,) = torch.autograd.grad(loss, leaf, g, retain_graph=True)
        (second,) = torch.autograd.grad(loss, leaf, g)  # (may donate: the graph is freed after this one)
        assert seen[0].data_ptr() != where
        (expected,) = torch.autograd.grad(cross_entropy.reference(leaf, target), leaf, g)
        torch.testing.assert_close(first, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(second, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
@pytest.mark.parametrize("kind", OPS)
def test_create_graph_does_not_donate(kind, device):
    op = OPS[kind]
    leaf, target = _inputs(device)
    for _ in range(CALLS):
        seen = []
        loss, where = _made_inside(op, leaf, target, seen)
        g = torch.randn_like(loss)
        (got,) = torch.autograd.grad(loss, leaf, g, create_graph=True, retain_graph=False)
        assert seen[0].data_ptr() != where
        (expected,) = torch.autograd.grad(cross_entropy.reference(leaf, target), leaf, g)
        torch.testing.assert_close(got.detach(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", OPS)
def test_a_second_backward_after_a_donated_one_raises(kind, device):
    op = OPS[kind]
    leaf, target = _inputs(device)
    for i in range(CALLS):
        seen = []
        loss, where = _made_inside(op, leaf, target, seen)
        loss.sum().backward()
        assert seen[0].data_ptr() == where or i == 0
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.sum().backward()


def test_an_in_place_change_after_the_call_is_still_refused(device):
    leaf, target = _inputs(device)
    for _ in range(CALLS):
        made = leaf * 1.0
        loss = cross_entropy.cross_entropy(made, target, cross_entropy.IGNORE_INDEX)
        made.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.sum().backward()


# -- the bindings users pass ------------------------------------------------------------------------------------


@pytest.mark.parametrize("binding", ["same tensor twice", "expanded", "transposed", "view of a base held",
                                     "whole view of a dropped base"])
def test_bindings(binding, device):
    a = torch.randn(7, 53, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, 53, device=device, dtype=torch.float64, requires_grad=True)
    for i in range(CALLS):
        kept = None
        if binding == "same tensor twice":
            x = a * 1.0
            args = (x, x)
        elif binding == "expanded":
            x = (a[:1] * 1.0).expand(7, 53)
            args = (x, b)
        elif binding == "transposed":
            x = (a * 1.0).t().contiguous().t()
            args = (x, b)
        elif binding == "view of a base held":
            kept = a * 1.0
            x = kept[2:]
            args = (x, b[2:])
        else:
            x = (a.reshape(-1) * 1.0).view(7, 53)
            args = (x, b)
        before = None if kept is None else kept.clone()
        taken = donation.taken
        y = bare_swiglu(*args)  # (bare: it makes an expanded or transposed input contiguous itself)
        g = torch.randn_like(y)
        del x, args
        got = torch.autograd.grad(y, (a, b), g, allow_unused=True)
        expected = _swiglu_reference_grads(binding, a, b, g)
        for r, e in zip(got, expected, strict=True):
            if e is None:
                assert r is None or not r.any()
            else:
                torch.testing.assert_close(r, e, rtol=1e-12, atol=1e-12)
        if kept is not None:
            assert torch.equal(kept, before)
        donated = donation.taken - taken
        if binding in ("same tensor twice", "view of a base held"):
            assert not donated, binding  # (two inputs on one storage; another holder of its memory)
        else:  # (x's own memory, or the contiguous copy the op makes of an expanded or transposed x)
            assert donated or i == 0, binding


def _swiglu_reference_grads(binding, a, b, g):
    a, b = a.detach().requires_grad_(True), b.detach().requires_grad_(True)
    if binding == "same tensor twice":
        y = swiglu.reference(a * 1.0, a * 1.0)
    elif binding == "expanded":
        y = swiglu.reference(a[:1].expand(7, 53), b)
    elif binding == "transposed":
        y = swiglu.reference(a, b)
    elif binding == "view of a base held":
        y = swiglu.reference(a[2:], b[2:])
    else:
        y = swiglu.reference(a, b)
    return torch.autograd.grad(y, (a, b), g, allow_unused=True)


# -- the derived kernel must update the input in place -----------------------------------------------------------


@triton.jit
def mirrored_product_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(x_ptr + (n - 1 - offs), mask=mask)  # another program's elements
    tl.store(y_ptr + offs, a * b, mask=mask)


@tritongrad.op
def mirrored_product(x):
    y = torch.empty_like(x)
    mirrored_product_kernel[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16)
    return y


def test_a_kernel_reading_other_programs_elements_is_not_donated_to(device):
    leaf = torch.randn(70, device=device, dtype=torch.float64, requires_grad=True)
    for _ in range(CALLS):
        seen = []
        made = leaf * 1.0
        made.register_hook(lambda g, seen=seen: seen.append(g))
        where = made.data_ptr()
        y = mirrored_product(made)
        del made
        g = torch.randn_like(y)
        (got,) = torch.autograd.grad(y, leaf, g)
        ref = leaf.detach().requires_grad_(True)
        (expected,) = torch.autograd.grad(ref * ref.flip(0), ref, g)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        assert seen[0].data_ptr() != where


def test_only_an_update_in_place_passes_the_analysis(device):
    """The derived kernels' own check: cross-entropy's (its loop loads a block, then stores its gradient there) and
    swiglu's pass; the mirrored product's second load reads what another program's store writes."""
    found = {}
    for name, call in (("cross_entropy", lambda t: _call(cross_entropy.cross_entropy, t, _inputs(device)[1])),
                       ("mirrored", mirrored_product)):
        x = torch.randn(13, 101, device=device, dtype=torch.float64, requires_grad=True)
        for _ in range(2):
            call(x * 1.0).sum().backward()
        found[name] = donation._safe.copy()
        donation._safe.clear()
    assert any(found["cross_entropy"].values())
    assert found["mirrored"] and not any(found["mirrored"].values())


# -- an input the launch updates in place: Liger's loss-only cross-entropy zeroes the ignored rows' logits ---------


def _liger_style():
    import test_liger_style

    return test_liger_style


liger_rows = tritongrad.op(lambda logits, target, n: _liger_style().cross_entropy_per_row(logits, target, n))


def _hf_inputs(device, rows=11, hidden=5, vocab=43):
    x = torch.randn(rows, hidden, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(hidden, vocab, device=device, dtype=torch.float64, requires_grad=True)
    target = _liger_style().targets(rows, vocab, device, ignored=(1, 4, 5, 10))
    return x, w, target, int((target != _liger_style().IGNORE).sum())


def _hf_loss(logits, target, n, seen):
    """As HF's loss function calls Liger's: the logits made fresh for it (``logits.float()`` of bf16 logits; here a
    float64 copy) and dropped when it returns; the gradient of that fresh tensor's values caught on its way back."""
    made = logits.to(torch.float64, copy=True)
    made.register_hook(seen.append)  # (registered before the launch: the gradient of the values it was given)
    seen.append(made.data_ptr())
    return liger_rows(made, target, n)


def _want(x, w, target, n):
    return torch.nn.functional.cross_entropy(x @ w, target, ignore_index=_liger_style().IGNORE, reduction="none") / n


def test_logits_a_loss_only_cross_entropy_zeroes_take_their_gradient_in_their_own_memory(device, poisoned_empty):
    """The launch zeroes the ignored rows' logits (they are an output of the node: an input updated in place); nothing
    reads them after, so their new values have no gradient, and the derived kernel writes every element (the loads'
    adjoints, zeros on the ignored rows) after reading it: the logits' memory takes their gradient. Before: a buffer
    of its own, zero-filled."""
    x, w, target, n = _hf_inputs(device)
    for i in range(CALLS):
        seen, taken = [], donation.taken
        rows = _hf_loss(x @ w, target, n, seen)
        g = torch.randn_like(rows)
        got = torch.autograd.grad(rows, (x, w), g)
        for a, b in zip(got, torch.autograd.grad(_want(x, w, target, n), (x, w), g), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        where, gradient = seen
        assert (donation.taken - taken, gradient.data_ptr() == where) == ((0, False) if i == 0 else (1, True)), i
        assert not gradient[[1, 4, 5, 10]].any()  # (the ignored rows' zeros stored over their logits)


@pytest.mark.parametrize("hold", ["nothing", "the base", "the view"])
def test_logits_seen_through_a_view_as_hf_passes_them(hold, device, poisoned_empty):
    """As HF's loss hands them over: ``logits.float()`` of the model's 3-D logits, flattened by ``view(-1, vocab)``.
    The op marks the base dirty (so the call sees the storage as two views, the 2-D one launched and the 3-D base),
    and the gradient buffer is flat: the storage's memory is taken all the same, unless the caller still holds the
    base or the view (then nothing is written over them but the ignored rows' zeros the launch stored)."""
    x, w, target, n = _hf_inputs(device, rows=12)
    vocab = w.shape[1]
    for i in range(CALLS):
        seen, taken = [], donation.taken
        made = (x @ w).view(3, 4, vocab).to(torch.float64, copy=True)
        made.register_hook(seen.append)
        where, flat = made.data_ptr(), made.view(-1, vocab)
        rows = liger_rows(flat, target, n)
        held = {"nothing": None, "the base": made, "the view": flat}[hold]
        left = None if held is None else held.clone()
        del made, flat
        g = torch.randn_like(rows)
        got = torch.autograd.grad(rows, (x, w), g)
        for a, b in zip(got, torch.autograd.grad(_want(x, w, target, n), (x, w), g), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        (gradient,) = seen
        assert not gradient.view(-1, vocab)[[1, 4, 5, 10]].any()
        donated = hold == "nothing" and i > 0
        assert (donation.taken - taken, gradient.data_ptr() == where) == ((1, True) if donated else (0, False)), i
        if held is not None:
            assert torch.equal(held, left)


def test_logits_the_caller_holds_are_not_written(device, poisoned_empty):
    x, w, target, n = _hf_inputs(device)
    for _ in range(CALLS):
        made, taken = x @ w, donation.taken
        rows = liger_rows(made, target, n)
        left = made.clone()  # (as the launch left them: the ignored rows zeroed)
        g = torch.randn_like(rows)
        got = torch.autograd.grad(rows, (x, w), g)
        for a, b in zip(got, torch.autograd.grad(_want(x, w, target, n), (x, w), g), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert donation.taken == taken and torch.equal(made, left)


def test_logits_used_after_the_call_are_not_written(device, poisoned_empty):
    """The updated logits read after the op (their new values have a gradient, which the buffer starts with): their
    memory is not taken, and the gradient of the values given is the loss's plus what passes through the rows not
    zeroed."""
    x, w, target, n = _hf_inputs(device)
    keep = (target != _liger_style().IGNORE)[:, None].to(torch.float64)
    c = torch.randn(x.shape[0], w.shape[1], device=device, dtype=torch.float64)
    for _ in range(CALLS):
        taken = donation.taken
        made = (x @ w).to(torch.float64, copy=True)
        loss = liger_rows(made, target, n).sum() + (made * c).sum()
        del made
        got = torch.autograd.grad(loss, (x, w))
        want = _want(x, w, target, n).sum() + ((x @ w) * keep * c).sum()
        for a, b in zip(got, torch.autograd.grad(want, (x, w)), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert donation.taken == taken


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
def test_logits_updated_in_place_under_retain_graph_then_freed(device):
    x, w, target, n = _hf_inputs(device)
    for _ in range(CALLS):
        seen, taken = [], donation.taken
        rows = _hf_loss(x @ w, target, n, seen)
        g = torch.randn_like(rows)
        want = torch.autograd.grad(_want(x, w, target, n), (x, w), g)
        first = torch.autograd.grad(rows, (x, w), g, retain_graph=True)
        assert donation.taken == taken
        second = torch.autograd.grad(rows, (x, w), g)  # (may take it: the graph is freed after this one)
        for got in (first, second):
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert seen[1].data_ptr() != seen[0]  # (the first backward's gradient: its own memory)


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
def test_logits_updated_in_place_under_create_graph_are_not_written(device):
    x, w, target, n = _hf_inputs(device)
    for _ in range(CALLS):
        seen, taken = [], donation.taken
        rows = _hf_loss(x @ w, target, n, seen)
        g = torch.randn_like(rows)
        got = torch.autograd.grad(rows, (x, w), g, create_graph=True)
        for a, b in zip(got, torch.autograd.grad(_want(x, w, target, n), (x, w), g), strict=True):
            torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-12)
        assert donation.taken == taken and seen[1].data_ptr() != seen[0]
