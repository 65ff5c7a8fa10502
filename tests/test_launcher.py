"""Repeated backwards (launcher.Launcher): the first backward of a layout is checked, the second keeps each
step's launch as it made it, and later ones make that launch again with their own tensors. Each call here
has fresh random inputs and upstream gradients, poisoned unfilled buffers, and is compared with PyTorch
autograd on the plain-PyTorch reference: the kept launch must give what the full backward gives, for every
way a gradient reaches memory."""

import pytest
import torch
import triton
import triton.language as tl
from test_strategies import norm_rows, norm_twice, scale_kernel, two_readers, windows

import tritongrad
from tritongrad import examples
from tritongrad.host.launcher import Launcher
from tritongrad.host.replay import Replay
from tritongrad.runtime import relaunch

F64 = torch.float64
CALLS = 4  # checked, kept, launched again twice


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer made without a fill comes back NaN: an element a kept launch misses fails."""
    for name in ("empty", "empty_strided"):
        real = getattr(torch, name)

        def nan_filled(*args, real=real, **kwargs):
            t = real(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        monkeypatch.setattr(torch, name, nan_filled)


@pytest.fixture
def kept(monkeypatch):
    """The launches made by a Launcher, counted: a replay's StraightLineBackward (replay_backward.py) launches what each
    step's Launcher would."""
    count = []
    real = Launcher.__call__
    monkeypatch.setattr(Launcher, "__call__", lambda self, *a: count.append(1) or real(self, *a))
    backward = Replay.backward

    def counted(self, saved, grads, needs, *kept):
        schedule = (tuple(needs), tuple(g is not None for g in grads))
        if self.backwards.get(schedule):  # a StraightLineBackward: a kept launch per step
            count.extend([1] * len(self.plan.steps(*schedule)))
        return backward(self, saved, grads, needs, *kept)

    monkeypatch.setattr(Replay, "backward", counted)
    return count


def leaves(inputs: tuple) -> list:
    return [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
            for t in inputs]


def as_tuple(result) -> tuple:
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


def repeat(op, reference, make_inputs, kept: list) -> list[int]:
    """``op`` called CALLS times on fresh inputs, each forward and gradient against ``reference``'s. Returns
    how many kept launches each call made (the first two make none unless other tests ran the op before)."""
    counts = []
    for _ in range(CALLS):
        before = len(kept)
        inputs = make_inputs()
        ours, theirs = leaves(inputs), leaves(inputs)
        got, want = as_tuple(op(*ours)), as_tuple(reference(*theirs))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.detach(), w.detach(), rtol=1e-9, atol=1e-9)
        upstream = [torch.randn_like(w) for w in want]
        torch.autograd.backward(list(got), upstream)
        torch.autograd.backward(list(want), upstream)
        for a, b in zip(ours, theirs, strict=True):
            if isinstance(b, torch.Tensor) and b.requires_grad:
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-9)
        counts.append(len(kept) - before)
    return counts


# the examples whose launches a backward does not keep: interchanged kernels (matmul), state tapes the
# forward kept (flash attention, cross entropy)
DECIDED_IN_FULL = {"matmul", "flash_attention", "cross_entropy"}


@pytest.mark.parametrize("example", examples.EXAMPLES.values(), ids=lambda e: e.name)
def test_repeated_backwards_of_each_example(example, poisoned, kept, device):
    dtype = F64 if F64 in example.dtypes else torch.float32
    size = example.sizes[-1]
    counts = repeat(example.op, example.reference, lambda: example.make_inputs(size, device=device, dtype=dtype), kept)
    if example.name not in DECIDED_IN_FULL:
        assert counts[-1] > 0 and counts[-2] == counts[-1]  # every launch of the last two backwards


@tritongrad.op
def windows_op(x, step: int, w: int):
    programs = (x.numel() - w) // step + 1
    y = torch.empty(programs, dtype=x.dtype, device=x.device)
    windows[(programs,)](x, y, step, x.numel(), W=w)
    return y


@pytest.mark.parametrize("step", [12, 5])  # apart: stored; overlapping: added atomically
def test_repeated_backwards_of_windows(step, poisoned, kept):
    w, programs = 8, 9
    n = (programs - 1) * step + w
    counts = repeat(lambda x: windows_op(x, step, w), lambda x: (x.unfold(0, w, step) ** 2).sum(1),
                    lambda: (torch.randn(n, dtype=F64),), kept)
    assert counts[-2:] == [1, 1]


def test_repeated_backwards_of_two_launches_storing_then_adding(poisoned, kept):
    op = tritongrad.op(two_readers.__wrapped__)  # plans of its own: test_strategies spies on two_readers' replays
    counts = repeat(op, lambda x: (2.0 * x, 3.0 * x), lambda: (torch.randn(77, dtype=F64),), kept)
    assert counts[-2:] == [2, 2]


def norm_reference(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5)


def test_repeated_backwards_of_partial_rows_added_to_by_a_second_launch(poisoned, kept):
    op = tritongrad.op(norm_twice.__wrapped__)
    counts = repeat(op, lambda x1, x2, w, b: (norm_reference(x1, w, b), norm_reference(x2, w, b)),
                    lambda: (torch.randn(7, 45, dtype=F64), torch.randn(5, 45, dtype=F64), torch.randn(45, dtype=F64),
                             torch.randn(45, dtype=F64)), kept)
    assert counts[-2:] == [2, 2]


@tritongrad.op
def norm_long_weight(x, w, b):
    """A weight longer than the rows: the partial rows' elements past them are zero-filled, not stored."""
    y = torch.empty_like(x)
    norm_rows[(x.shape[0],)](x, w, b, y, x.shape[1], x.shape[1], BLOCK=64)
    return y


def test_repeated_backwards_of_partial_rows_the_loads_do_not_cover(poisoned, kept):
    counts = repeat(norm_long_weight, lambda x, w, b: norm_reference(x, w[:45], b),
                    lambda: (torch.randn(9, 45, dtype=F64), torch.randn(51, dtype=F64), torch.randn(45, dtype=F64)),
                    kept)
    assert counts[-2:] == [1, 1]


@triton.jit
def scale_in_place(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, tl.sin(x) * 3.0, mask=offs < n)


@tritongrad.op
def norm_then_scale(x, w, b):
    y = torch.empty_like(x)
    norm_rows[(x.shape[0],)](x, w, b, y, x.shape[1], x.shape[1], BLOCK=64)
    scale_in_place[(triton.cdiv(y.numel(), 32),)](y, y.numel(), BLOCK=32)
    return y


def test_repeated_backwards_through_an_in_place_launch(poisoned, kept):
    counts = repeat(norm_then_scale, lambda x, w, b: torch.sin(norm_reference(x, w, b)) * 3.0,
                    lambda: (torch.randn(6, 37, dtype=F64), torch.randn(37, dtype=F64), torch.randn(37, dtype=F64)),
                    kept)
    assert counts[-2:] == [2, 2]


def scaled_op():
    """A new op each time: its plans are its own."""

    @tritongrad.op
    def scaled(x, factor: float):
        y = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 32),)](x, y, factor, x.numel(), BLOCK=32)
        return y

    return scaled


def test_a_launch_with_new_non_tensor_arguments_is_decided_in_full(kept):
    scaled, x = scaled_op(), torch.randn(29, dtype=F64, requires_grad=True)
    for factor in (2.0, 2.0, 2.0, 5.0, 5.0):  # one layout; the launch with 5.0 is kept from its own first backward
        x.grad = None
        upstream = torch.randn(29, dtype=F64)
        scaled(x, factor).backward(upstream)
        torch.testing.assert_close(x.grad, factor * upstream, rtol=1e-12, atol=1e-12)
    assert len(kept) == 2


def test_a_kept_launch_holds_no_tensors(monkeypatch):
    """A plan outlives its calls: what it keeps must not keep their tensors (saved inputs, gradients) alive."""
    made = []
    real = Launcher.of
    monkeypatch.setattr(Launcher, "of", staticmethod(lambda *a: made.append(real(*a)) or made[-1]))
    scaled, x = scaled_op(), torch.randn(29, dtype=F64, requires_grad=True)
    for _ in range(2):
        scaled(x, 7.0).backward(torch.randn(29, dtype=F64))
    assert made
    for launcher in made:
        for traced, _ in launcher.launches:
            assert not any(isinstance(v, torch.Tensor) for v in traced.args.values())


@pytest.mark.gpu
def test_kept_launches_call_the_compiled_kernel_per_alignment_of_their_tensors(monkeypatch):
    """On a GPU a kept launch calls its compiled kernel's launcher directly (relaunch.py), the compiled kernel
    kept per the 16-byte alignment of its tensors: an upstream gradient at an address 8 bytes past one is
    another specialization, launched by Triton first, then directly too. Every gradient against the exact one."""
    if not relaunch.supported():
        pytest.skip("this Triton's launch is not the one relaunch.py repeats")
    made = []
    real = Launcher.of
    monkeypatch.setattr(Launcher, "of", staticmethod(lambda *a: made.append(real(*a)) or made[-1]))
    through_triton, direct = [], []  # per launch of the derived kernel: Triton's (the first of an alignment), direct
    real_first, real_launch = relaunch.Relauncher._first, relaunch.Relauncher.launch

    def first(self, *args):
        if self.kernel is not scale_kernel:  # the forward's launches are made again too (launch_record.py)
            through_triton.append(len(self.compiled))
        return real_first(self, *args)

    def launch(self, values):
        compiled = real_launch(self, values)
        if compiled is not None and self.kernel is not scale_kernel:
            direct.append(len(self.compiled))
        return compiled

    monkeypatch.setattr(relaunch.Relauncher, "_first", first)
    monkeypatch.setattr(relaunch.Relauncher, "launch", launch)
    scaled, x = scaled_op(), torch.randn(29, dtype=F64, requires_grad=True)
    offsets = (0, 0, 0, 0, 1, 1, 0)
    for offset in offsets:
        x.grad = None
        upstream = torch.randn(29 + offset, dtype=F64)[offset:]
        assert (upstream.data_ptr() % 16 == 0) == (offset == 0)
        scaled(x, 3.0).backward(upstream)
        torch.testing.assert_close(x.grad, 3.0 * upstream, rtol=0, atol=0)
    relauncher = made[0].launches[0][0].relauncher
    assert relauncher.direct and len(relauncher.compiled) == 2
    # Triton launched it once per alignment (the first aligned, the first misaligned); once both are kept, each
    # alignment's launch is direct (the first backwards of a plan launch through the BackwardKernel: not counted)
    assert through_triton == [0, 1] and direct[-2:] == [2, 2], (through_triton, direct)


@triton.jit
def sin_cos(x_ptr, s_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(s_ptr + offs, tl.sin(x), mask=offs < n)
    tl.store(c_ptr + offs, tl.cos(x), mask=offs < n)


@tritongrad.op
def sin_and_cos(x):
    s, c = torch.empty_like(x), torch.empty_like(x)
    sin_cos[(triton.cdiv(x.numel(), 32),)](x, s, c, x.numel(), BLOCK=32)
    return s, c


def test_one_upstream_gradient_for_two_outputs_is_not_kept_as_one(kept):
    """Kept with one tensor as both outputs' gradients, a launch would read one of them twice on a later call
    whose outputs have two."""
    x = torch.randn(77, dtype=F64, requires_grad=True)
    for same in (False, True, False, False):
        x.grad = None
        s, c = sin_and_cos(x)
        gs = torch.randn_like(s)
        gc = gs if same else torch.randn_like(c)
        torch.autograd.backward([s, c], [gs, gc])
        torch.testing.assert_close(x.grad, torch.cos(x) * gs - torch.sin(x) * gc, rtol=1e-12, atol=1e-12)
    assert not kept
