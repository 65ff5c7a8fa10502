"""Replays (host/replay.py, host/replay_backward.py): a named op's later calls of a kind seen before are compared
with the first one's launches as they run and take its plan; their backward launches what an earlier one kept.
Each test calls ops several times on fresh inputs and compares outputs and gradients, exactly, with the op's
first call on the same inputs (or with PyTorch where that call is a different kind), and counts the calls that
were replayed: a call whose aliasing, strides, offsets, dtypes, ``requires_grad`` or values differ from the
replay's must be handled (or refused) as a first call is."""

import gc
import weakref

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import examples
from tritongrad.core.errors import OpError
from tritongrad.host import replay

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),  # (23 of 23 failed on the H100: to port)
                                reason="written for CPU tensors in the interpreter")

F64 = torch.float64
DEVICE = torch.empty(0).device  # the tests' device (conftest.py: CUDA's where there is a GPU)


@pytest.fixture
def replayed(monkeypatch):
    """Counts: calls that ran on a replay to the end ("forward"), that fell back ("fell"), backwards through a
    StraightLineBackward ("backward")."""
    counts = {"forward": 0, "fell": 0, "backward": 0}
    close, fall, backward = replay.FastRecord.close, replay.FastRecord._fall_back, replay.Replay.backward

    def counted_close(self, *args, **kwargs):
        found = close(self, *args, **kwargs)
        counts["forward"] += found is not None
        return found

    monkeypatch.setattr(replay.FastRecord, "close", counted_close)
    monkeypatch.setattr(replay.FastRecord, "_fall_back", lambda self, *a, **k: counts.__setitem__(
        "fell", counts["fell"] + 1) or fall(self, *a, **k))
    def counted_backward(self, saved, grads, needs, *kept):
        counts["backward"] += bool(self.backwards.get((tuple(needs), tuple(g is not None for g in grads))))
        return backward(self, saved, grads, needs, *kept)

    monkeypatch.setattr(replay.Replay, "backward", counted_backward)
    return counts


def leaves(inputs) -> list:
    return [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
            for t in inputs]


def step(fn, inputs, upstream=None, seed=0) -> list:
    """``fn`` on copies of ``inputs`` (floating-point ones requiring grad unless already leaves that do not): its
    outputs and the inputs' gradients for random upstream gradients (seeded)."""
    outs = fn(*inputs)
    outs = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o.is_floating_point()]
    gen = torch.Generator().manual_seed(seed)
    grads = upstream or [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs] + [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def assert_same(got: list, want: list) -> None:
    """Bit for bit (the interpreter runs every program in turn)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.dtype == w.dtype and g.shape == w.shape
            if g.is_cuda:  # (a GPU's atomic additions land in any order: float64 to its last bits)
                torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
            else:
                assert torch.equal(g, w), (g - w).abs().max()


REPLAYED = ("softmax", "rmsnorm", "layernorm", "swiglu", "add_rmsnorm", "log_softmax", "geglu", "rotary")


@pytest.mark.parametrize("name", REPLAYED)
def test_later_calls_are_replayed_with_the_first_calls_gradients(name, replayed):
    """The first call of a kind (its checked backward), the second (its backward keeps each step's launch) and
    the later ones (replayed forward and backward) give the same outputs and gradients, bit for bit."""
    example = examples.get(name)
    inputs = example.make_inputs(example.sizes[-1], device=DEVICE, dtype=F64)
    first = step(example.op, leaves(inputs))
    for _ in range(4):
        assert_same(step(example.op, leaves(inputs)), first)
    want = step(example.reference, leaves(inputs))
    for g, w in zip(first, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    assert replayed["forward"] >= 3 and replayed["backward"] >= 2
    assert replayed["fell"] <= 1  # (the first call, where other tests left the op replays of other kinds)


def test_a_call_passing_one_tensor_twice_is_not_the_replays(replayed):
    """swiglu(a, b) learnt with two tensors; swiglu(x, x) and two overlapping views of one storage are calls of
    their own kinds (one shadow, gradients added), as their first calls are; the replay serves a, b again."""
    swiglu = examples.get("swiglu")
    a, b = (torch.randn(5, 61, dtype=F64) for _ in range(2))
    first = step(swiglu.op, leaves((a, b)))
    step(swiglu.op, leaves((a, b)))
    fell = replayed["fell"]
    for _ in range(3):
        x = torch.randn(5, 61, dtype=F64, requires_grad=True)
        got = step(lambda x: swiglu.op(x, x), [x])
        xr = x.detach().clone().requires_grad_()
        torch.testing.assert_close(got, step(lambda x: swiglu.reference(x, x), [xr]), rtol=1e-12, atol=1e-12)
    assert replayed["fell"] == fell + 1  # its first call; then its own replay
    for _ in range(3):
        base = torch.randn(6 * 61, dtype=F64, requires_grad=True)
        got = step(lambda t: swiglu.op(t[:305].view(5, 61), t[61:].view(5, 61)), [base])
        baser = base.detach().clone().requires_grad_()
        want = step(lambda t: swiglu.reference(t[:305].view(5, 61), t[61:].view(5, 61)), [baser])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert replayed["fell"] == fell + 2
    assert_same(step(swiglu.op, leaves((a, b))), first)
    assert replayed["fell"] == fell + 2


@triton.jit
def mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * b, mask=mask)


def scaled_through_op(name: str):
    """A named op of its own (its replays its own): y = x * w * w, w * w written into the caller's ``buf`` first;
    ``block``: the second launch's."""

    @tritongrad.op(f"tritongrad_tests::{name}")
    def scaled_through(x: torch.Tensor, w: torch.Tensor, buf: torch.Tensor, block: int = 32) -> torch.Tensor:
        n = x.numel()
        y = torch.empty_like(x)
        mul_kernel[(triton.cdiv(n, 32),)](w, w, buf, n, BLOCK=32)
        mul_kernel[(triton.cdiv(n, block),)](x, buf, y, n, BLOCK=block)
        return y

    return scaled_through


def test_aliasing_a_launch_must_refuse_is_refused_after_replays(replayed):
    """A buffer that is the weight itself (one tensor twice) or a view of its storage makes the first launch
    overwrite what it reads: refused, as on a first call, however many replays ran before; the replay goes on."""
    scaled_through = scaled_through_op("scaled_through")
    x, w = torch.randn(100, dtype=F64), torch.randn(100, dtype=F64)
    first = step(scaled_through, [x.clone().requires_grad_(), w, torch.empty(100, dtype=F64)])
    for _ in range(3):
        assert_same(step(scaled_through, [x.clone().requires_grad_(), w, torch.empty(100, dtype=F64)]), first)
    assert replayed["forward"] >= 2
    for aliased in (lambda w: w, lambda w: w.view(10, 10).view(-1), lambda w: w[:]):
        for _ in range(2):
            wv = torch.randn(100, dtype=F64)
            # (recorded as its alias view's, out_ptr read as a_ptr: host/aliases.py; b_ptr still reads w)
            with pytest.raises(OpError, match=r"launch #1 \(`mul_kernel`\) overwrites `a_ptr`, memory that launch #1 "
                                              r"\(`mul_kernel`\) reads through `b_ptr`"):
                scaled_through(x.clone().requires_grad_(), wv, aliased(wv))
    assert_same(step(scaled_through, [x.clone().requires_grad_(), w, torch.empty(100, dtype=F64)]), first)


def test_a_later_launch_that_differs_falls_back_with_the_launches_before_it_recorded(replayed):
    """The second launch's values change (its block): the first launch, run on the replay, is recorded as a launch
    record records it and the call goes on as a first call; both kinds are then replayed, the one whose first launch
    matched giving way to the other at the second launch (FastRecord._switch)."""
    scaled_through = scaled_through_op("scaled_through_blocks")
    x, w = torch.randn(100, dtype=F64), torch.randn(100, dtype=F64)
    firsts = {}
    for block in (32, 32, 32, 64, 64, 64, 32, 64):
        xs = x.clone().requires_grad_()
        got = step(scaled_through, [xs, w, torch.empty(100, dtype=F64), block])
        torch.testing.assert_close(got[-1], step(lambda x: x * w * w, [x.clone().requires_grad_()])[-1])
        assert_same(got, firsts.setdefault(block, got))
    assert replayed["fell"] == 1 and replayed["forward"] == 6  # the second kind's first call; the rest replayed


@pytest.mark.parametrize("change", ["offset", "shape", "dtype", "requires_grad"])
def test_a_call_whose_tensors_differ_is_a_first_call_of_its_kind(change, replayed):
    """Later calls whose tensors lie elsewhere in their storage, in another shape (the launch's values the same),
    in another dtype or with another ``requires_grad`` than the replay's: gradients as PyTorch's, then replayed in
    turn with the first."""
    swiglu = examples.get("swiglu")
    a, b = (torch.randn(4, 53, dtype=F64) for _ in range(2))  # (a size no other test calls it at)
    first = step(swiglu.op, leaves((a, b)))
    step(swiglu.op, leaves((a, b)))
    fell = replayed["fell"]
    for _ in range(3):
        if change == "offset":  # a view one element into its storage
            base = torch.randn(213, dtype=F64, requires_grad=True)
            args = [base, b.clone().requires_grad_()]
            fn = lambda t, b: swiglu.op(t[1:].view(4, 53), b)  # noqa: E731
            ref = lambda t, b: swiglu.reference(t[1:].view(4, 53), b)  # noqa: E731
        elif change == "shape":  # the same elements in another shape: the same launch, other tensors
            args = [a.reshape(53, 4).clone().requires_grad_(), b.reshape(53, 4).clone().requires_grad_()]
            fn, ref = swiglu.op, swiglu.reference
        elif change == "dtype":
            args = [a.float().requires_grad_(), b.float().requires_grad_()]
            fn, ref = swiglu.op, swiglu.reference
        else:  # b needs no gradient
            args = [a.clone().requires_grad_(), b.clone()]
            fn, ref = swiglu.op, swiglu.reference
        got = step(fn, args)
        want = step(ref, [t.detach().clone().requires_grad_(t.requires_grad) for t in args])
        tol = 1e-5 if change == "dtype" else 1e-12
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert replayed["fell"] == fell + 1  # the first call of the new kind; later ones are its replay's
    assert_same(step(swiglu.op, leaves((a, b))), first)


def test_strides_the_first_call_refuses_are_refused_after_replays(replayed):
    """Transposed arguments, made contiguous inside a named op, are refused (the copy is a PyTorch operation the
    registered op cannot see), on every call, after replays of contiguous ones as on a first call."""
    swiglu = examples.get("swiglu")
    a, b = (torch.randn(5, 61, dtype=F64) for _ in range(2))
    first = step(swiglu.op, leaves((a, b)))
    step(swiglu.op, leaves((a, b)))
    for _ in range(3):
        at, bt = (t.t().contiguous().requires_grad_() for t in (a, b))
        with pytest.raises(OpError, match="neither an argument of the op nor written by an earlier launch"):
            swiglu.op(at.t(), bt.t())
    assert_same(step(swiglu.op, leaves((a, b))), first)


@tritongrad.op("tritongrad_tests::rows")
def rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows_kernel[(x.shape[0],)](x, w, y, x.shape[1], *x.stride(), *y.stride(), BLOCK=64)
    return y


@triton.jit
def rows_kernel(x_ptr, w_ptr, y_ptr, n_cols, sxr, sxc, syr, syc, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * sxr + cols * sxc, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(y_ptr + row * syr + cols * syc, tl.sin(x) * w, mask=mask)


def test_strides_a_kernel_takes_are_replayed_per_layout(replayed):
    """A kernel addressing its input through strides it is passed: contiguous and transposed inputs are two kinds
    of call, each replayed, each gradient PyTorch's."""
    w = torch.randn(37, dtype=F64)
    for _ in range(3):
        for transposed in (False, True):
            x = torch.randn(37, 9, dtype=F64) if transposed else torch.randn(9, 37, dtype=F64)
            args = [x.requires_grad_(), w.clone().requires_grad_()]
            fn = (lambda x, w: rows(x.t(), w)) if transposed else rows
            ref = (lambda x, w: torch.sin(x.t()) * w) if transposed else (lambda x, w: torch.sin(x) * w)
            got = step(fn, args)
            want = step(ref, [t.detach().clone().requires_grad_() for t in args])
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert replayed["forward"] >= 4 and replayed["fell"] <= 1


def test_grad_mode_off_runs_the_op_as_it_is(replayed):
    softmax = examples.get("softmax")
    x = torch.randn(6, 37, dtype=F64)
    first = step(softmax.op, leaves((x,)))
    step(softmax.op, leaves((x,)))
    forward = replayed["forward"]
    with torch.no_grad():
        y = softmax.op(x.clone().requires_grad_())
    assert y.grad_fn is None and not y.requires_grad and torch.equal(y, first[0])
    assert replayed["forward"] == forward
    assert_same(step(softmax.op, leaves((x,))), first)
    assert replayed["forward"] == forward + 1


def test_two_kinds_called_in_turn_are_both_replayed(replayed):
    rmsnorm = examples.get("rmsnorm")
    inputs = {rows: rmsnorm.make_inputs((rows, 45), device=DEVICE, dtype=F64) for rows in (7, 3)}
    firsts = {rows: step(rmsnorm.op, leaves(i)) for rows, i in inputs.items()}
    fell = replayed["fell"]
    for _ in range(3):
        for rows, i in inputs.items():
            assert_same(step(rmsnorm.op, leaves(i)), firsts[rows])
    assert replayed["fell"] == fell and replayed["forward"] >= 6


def test_a_replayed_call_keeps_no_tensor_alive(replayed):
    """What a replay and its backward keep outlives their calls: none of a call's tensors (its buffers, outputs,
    gradients) may stay alive through them."""
    layernorm = examples.get("layernorm")
    inputs = layernorm.make_inputs((7, 45), device=DEVICE, dtype=F64)
    refs = []
    for _ in range(4):
        args = leaves(inputs)
        y = layernorm.op(*args)
        upstream = torch.randn_like(y)
        y.backward(upstream)
        refs += [weakref.ref(t) for t in (*args, y, upstream, args[0].grad)]
        del args, y, upstream
    gc.collect()
    assert replayed["forward"] >= 3 and replayed["backward"] >= 2
    assert not [r for r in refs if r() is not None]


def test_replays_can_be_turned_off(monkeypatch, replayed):
    monkeypatch.setattr(replay, "ENABLED", False)
    softmax = examples.get("softmax")
    x = torch.randn(4, 300, dtype=F64)
    first = step(softmax.op, leaves((x,)))
    for _ in range(3):
        assert_same(step(softmax.op, leaves((x,))), first)
    assert replayed == {"forward": 0, "fell": 0, "backward": 0}


@pytest.mark.parametrize("name", ["cross_entropy", "flash_attention"])
def test_calls_keeping_state_tapes_are_replayed_on_tapes_of_their_own(name, replayed, monkeypatch):
    """cross entropy's and attention's forwards keep their online softmax's state on tapes for the backward
    (augment.py): a replayed call keeps its own. Three calls on different inputs run forward before any backward,
    their backwards then in another order: each gets its own inputs' gradients (from a first call of its own),
    so no backward reads another call's tapes; the augmented forwards ran on all of them."""
    from tritongrad.runtime import augment

    kept = []  # each call's fresh tapes (a replay's launch keeps the augment.Keeping its first call made)
    fresh = augment.Keeping.fresh
    monkeypatch.setattr(augment.Keeping, "fresh", lambda self: (lambda found: (kept.append(found), found)[1])(
        fresh(self)))
    example = examples.get(name)
    size = example.sizes[-1] if name == "cross_entropy" else example.sizes[0]
    calls = [example.make_inputs(size, device=DEVICE, dtype=F64) for _ in range(3)]  # (fresh values: one kind)
    want = [step(example.reference, leaves(inputs), seed=i) for i, inputs in enumerate(calls)]
    step(example.op, leaves(calls[0]))  # (a first call: the replay learnt)
    runs = []
    for i, inputs in enumerate(calls):
        args = leaves(inputs)
        outs = example.op(*args)
        runs.append((i, args, outs if isinstance(outs, (tuple, list)) else (outs,)))
    # (the learning call too, where an earlier test taught the op this kind of call)
    assert replayed["forward"] >= 3 and len([k for k in kept if k is not None]) >= 3
    for i, args, outs in (runs[1], runs[2], runs[0]):
        outs = [o for o in outs if o.is_floating_point()]
        gen = torch.Generator().manual_seed(i)
        torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs])
        got = [o.detach() for o in outs] + [t.grad for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
        for g, w in zip(got, want[i], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_backwards_of_calls_keeping_state_tapes_are_written_out_with_each_calls_tapes(replayed):
    """A replay's backward written out (StraightLineBackward) reads the state tapes of the call it differentiates (each
    call's augmented forward keeps its own: FastRecord.kept): three cross-entropy calls on different inputs, their
    backwards in another order, each through a StraightLineBackward, each with its own inputs' gradients."""
    example = examples.get("cross_entropy")
    size = example.sizes[-1]
    for seed in range(3):  # a first call, a checked backward, one that keeps its Launchers
        step(example.op, leaves(example.make_inputs(size, device=DEVICE, dtype=F64)), seed=seed)
    calls = [example.make_inputs(size, device=DEVICE, dtype=F64) for _ in range(3)]
    want = [step(example.reference, leaves(inputs), seed=i) for i, inputs in enumerate(calls)]
    runs = []
    for inputs in calls:
        args = leaves(inputs)
        runs.append((args, [o for o in as_tuple(example.op(*args)) if o.is_floating_point()]))
    before = replayed["backward"]
    for i in (1, 2, 0):
        args, outs = runs[i]
        gen = torch.Generator().manual_seed(i)
        torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs])
        got = [o.detach() for o in outs] + [t.grad for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
        for g, w in zip(got, want[i], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    assert replayed["backward"] - before == 3


def as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def test_direct_launches_pass_the_values_triton_binds(monkeypatch, replayed):
    """Where a launch goes past Triton (on a GPU), a replay passes its Relauncher every parameter's value in Triton's
    order, made from the launch's arguments (forward) or the kept launch's values (backward): the values its
    arguments by name give. Relaunchers made direct here (the interpreter's kernels are not) refuse each direct
    launch, so each goes on by name through Triton: the two lists compared, gradients exact."""
    from tritongrad.runtime import relaunch

    monkeypatch.setattr(relaunch, "supported", lambda: True)
    monkeypatch.setattr(relaunch, "_jit_function", lambda kernel: True)
    monkeypatch.setattr(relaunch, "current_device", lambda: 0)
    given = []
    monkeypatch.setattr(relaunch.Relauncher, "launch", lambda self, values: given.append((self, list(values))))
    swiglu = examples.get("swiglu")
    inputs = swiglu.make_inputs((7, 45), device=DEVICE, dtype=F64)  # (its own size: Relaunchers of its own)
    first = step(swiglu.op, leaves(inputs))
    assert_same(step(swiglu.op, leaves(inputs)), first)  # (its backward keeps the launch)
    for _ in range(3):
        given.clear()
        assert_same(step(swiglu.op, leaves(inputs)), first)
        pairs = [(given[i], given[i + 1]) for i in range(0, len(given), 2)]
        assert len(pairs) == 2 and all(a[0] is b[0] for a, b in pairs)  # the forward's launch, the backward's
        for (_, by_position), (_, by_name) in pairs:
            assert len(by_position) == len(by_name)
            assert all(a is b or not isinstance(a, torch.Tensor) and a == b for a, b in
                       zip(by_position, by_name, strict=True))
    assert replayed["backward"] >= 2
