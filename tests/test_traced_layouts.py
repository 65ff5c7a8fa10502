"""The compiled backward is planned from fake tensors (ops/library.py's traced backward): a storage stands for the
address fake tensors lack (core/device.py). What the plan reads of a call's tensors (launch_record.py's key: storages
numbered in order of appearance, layouts) and the overlap facts the write strategies check must be the same as for
the real tensors, for every binding users pass; else the traced backward would pick strategies for other memory."""

import contextlib
import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from tritongrad.core import device
from tritongrad.host.call_tensors import CallTensors
from tritongrad.writes.launch_facts import Layout, overlap


def bound(binding: str) -> list[torch.Tensor]:
    g = torch.Generator(torch.get_default_device()).manual_seed(39)  # (cuda under the gpu run)
    base = torch.randn(9, 13, generator=g)
    return {
        "distinct": lambda: [base, torch.randn(13, generator=g), torch.randn(9, 13, generator=g)],
        "one tensor twice": lambda: [base, base, base[2]],
        "overlapping views of one storage": lambda: [base[1:], base[:-1], base[3]],
        "disjoint views of one storage": lambda: [base[:4], base[4:], base[:, 5]],
        "expanded": lambda: [base[0].expand(9, 13), base, torch.randn(1, generator=g).expand(13)],
        "transposed": lambda: [base.T, base[:, 2:].T, base],
        "empty": lambda: [base[:0], base, torch.randn(0, 5, generator=g)],
    }[binding]()


BINDINGS = ["distinct", "one tensor twice", "overlapping views of one storage", "disjoint views of one storage",
            "expanded", "transposed", "empty"]


def fake_of(tensors: list[torch.Tensor], functional: bool) -> tuple[list, object]:
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in tensors]  # (one fake storage per real one: views stay views)
    if not functional:
        return fakes, mode
    wrapped = {}  # (one wrapper per tensor, as a traced graph has one per input)
    with FunctionalTensorMode():
        return [wrapped.setdefault(id(f), FunctionalTensor.to_functional(f)) for f in fakes], mode


@pytest.mark.parametrize("functional", [False, True], ids=["fake", "functional"])
@pytest.mark.parametrize("binding", BINDINGS)
def test_traced_tensors_are_described_and_overlap_as_the_real_ones(binding, functional):
    real = bound(binding)
    traced, mode = fake_of(real, functional)
    described = []
    for tensors, tracing in ((real, False), (traced, True)):
        found = CallTensors()
        with device.traced() if tracing else contextlib.nullcontext():
            found.take(tuple(tensors))
        described.append([(key, dtype, tuple(size), tuple(stride), offset)
                          for key, dtype, size, stride, offset, *_ in found.described])
    assert described[0] == described[1]
    pairs = list(itertools.combinations(range(len(real)), 2))
    overlaps = {(i, j): overlap(Layout.of(real[i]), Layout.of(real[j])) for i, j in pairs}
    shared = {(i, j): device.storage_of(real[i]) == device.storage_of(real[j]) for i, j in pairs}
    with device.traced():
        for i, j in itertools.combinations(range(len(real)), 2):
            assert overlap(Layout.of(traced[i]), Layout.of(traced[j])) == overlaps[i, j], (i, j)
            assert (device.storage_of(traced[i]) == device.storage_of(traced[j])) == shared[i, j], (i, j)


def _rows(binding: str, grad: bool) -> tuple:
    """rmsnorm's (x, w) as a user may bind them, made of fresh leaves (that require grad where ``grad``)."""
    g = torch.Generator(torch.get_default_device()).manual_seed(41)
    leaf = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)  # noqa: E731
    base = leaf(9, 37)
    return {
        "distinct": lambda: (base, leaf(37)),
        "a weight that is a row of the input": lambda: (base[1:], base[0]),
        "one tensor, both": lambda: (base, base[3]),
        "a weight that is a row of another tensor": lambda: (base, leaf(4, 37)[2]),
        "one program": lambda: (leaf(1, 37), leaf(37)),
    }[binding]()  # (the example reads x and w as contiguous: other layouts are refused, eagerly and traced alike)


def _strategies(monkeypatch) -> list:
    from tritongrad.runtime import derive

    seen, real = [], derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, *args, **kwargs):
        seen.append((self.name, tuple(sorted((p, c.mode.name) for p, c in prepared.choices.items())),
                     len(prepared.variant.parts)))
        return real(self, grid, named, output_grads, buffers, prepared, *args, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    return seen


@pytest.mark.parametrize("binding", ["distinct", "a weight that is a row of the input", "one tensor, both",
                                     "a weight that is a row of another tensor", "one program"])
def test_the_traced_backward_chooses_what_the_eager_backward_chooses(binding, monkeypatch):
    """The backward as torch.compile traces it (library.py: fake tensors, the plan from their layouts, the derived
    launches gathered instead of run) takes the write strategies and variants an eager backward of the same call
    takes, for the bindings users pass (rmsnorm: its weight's gradient in partial rows or atomics, x's stored)."""
    from tritongrad.examples import rmsnorm
    from tritongrad.host import hooks
    from tritongrad.host.call_tensors import as_tuple
    from tritongrad.host.launch_record import LaunchRecord
    from tritongrad.host.saved_backward import _recorded
    from tritongrad.ops.autograd_function import arguments_of

    seen = _strategies(monkeypatch)
    out = rmsnorm.rmsnorm(*_rows(binding, grad=True))  # eagerly, through the op: its backward's choices
    out.backward(torch.randn_like(out))
    eager = list(seen)
    seen.clear()
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in _rows(binding, grad=False)]
    host = lambda x, w: rmsnorm.rmsnorm_launch(x.contiguous(), w, 1e-6)()  # noqa: E731
    with mode, device.traced():
        with hooks.collecting("skip") as launches:
            outputs = as_tuple(host(*fakes))
        record = _recorded(LaunchRecord("rows"), launches, lambda v: v, [])
        record.close(outputs, tuple(fakes), {}, arguments_of(host), diff_inputs=list(fakes))
        with hooks.collecting("skip") as derived:
            record.backward(tuple(record.saved), tuple(torch.randn_like(o) for o in outputs), [True, True], derived)
    assert eager and seen == eager
    assert derived.calls  # the derived kernels' launches were made (gathered, not run)


@pytest.mark.parametrize("binding", BINDINGS)
def test_the_rehearsal_gets_real_tensors_laid_out_as_the_traced_ones(binding):
    """library.py rehearses the eager backward on real tensors made from the traced ones: same dtypes, sizes,
    strides and offsets, views of one storage sharing one, and values to compute with (random floats)."""
    from tritongrad.host.saved_backward import real_like

    real = bound(binding)
    traced, _ = fake_of(real, functional=False)
    made = real_like((traced[0], list(traced[1:]), 3))
    assert made[2] == 3 and isinstance(made[1], list)
    made = [made[0], *made[1]]
    for r, t in zip(made, real, strict=True):
        assert (r.dtype, r.shape, r.stride(), r.storage_offset()) == (t.dtype, t.shape, t.stride(), t.storage_offset())
        assert type(r) is torch.Tensor and bool(torch.isfinite(r).all())
    for i, j in itertools.combinations(range(len(real)), 2):
        assert (device.storage_of(made[i]) == device.storage_of(made[j])) == (
            device.storage_of(real[i]) == device.storage_of(real[j])), (i, j)
    assert all(bool(r.ne(0).any()) for r in made if r.numel())  # (random: not the zeros they were made of)


def test_a_derived_kernel_made_self_contained_is_what_inductor_can_copy():
    """Inductor copies a user kernel's JIT dependencies into its own module by the names the kernel reads them under,
    and takes no module attributes but Triton's: a derived kernel's `tg.<helper>` calls become globals named as the
    helpers' own functions (codegen/generate.py `self_contained`), transitively."""
    import re

    import triton
    import triton.language as tl

    from tritongrad.codegen.generate import jit_src, self_contained
    from tritongrad.runtime.derive import grad

    @triton.jit
    def rows(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + tl.program_id(0) * n + cols, mask=cols < n, other=0.0)
        w = tl.load(w_ptr + cols, mask=cols < n, other=0.0)
        tl.store(y_ptr + tl.program_id(0) * n + cols, x * w / tl.sum(x * x, 0), mask=cols < n)

    bwd = grad(rows, ["x_ptr", "w_ptr"], ["y_ptr"], constexprs={"BLOCK": 64})
    kernels = {bwd.kernel}  # (the default variant: atomics, partial rows and their helpers)
    assert kernels and any("tg." in jit_src(k) for k in kernels)
    for kernel in kernels:
        contained = self_contained(kernel)
        assert contained is self_contained(kernel)  # (made once)
        assert "tg." not in jit_src(contained) and contained.fn.__name__ == kernel.fn.__name__
        pending, seen = [contained], set()
        while pending:
            k = pending.pop()
            for name in set(re.findall(r"\btg_\w+", jit_src(k))) - seen:
                seen.add(name)
                helper = k.fn.__globals__[name]
                if hasattr(helper, "fn"):  # (a jitted helper, not a constant)
                    assert helper.fn.__name__ == name and "tg." not in jit_src(helper)
                    pending.append(helper)
    assert {"tg_widened", "tg_unbroadcast"} <= seen, seen  # (unbroadcast calls widened: reached through it)


def test_an_augmented_forward_made_self_contained_is_what_inductor_can_copy():
    """A compiled forward launches the augmented kernel (runtime/augment.py) through wrap_triton: its own names for
    Triton's language and tritongrad's helpers (``tritongrad_tl``, ``tritongrad_tg``) become ``tl`` and globals of
    their own, as Inductor's module has them; and its gradient is the eager one's (test_op.py's
    test_compiled_forward_keeps_the_state_tapes_eager_keeps)."""
    import re

    from tritongrad.codegen.generate import jit_src, self_contained
    from tritongrad.examples import EXAMPLES
    from tritongrad.host import hooks

    example = EXAMPLES["flash_attention"]
    with hooks.collecting("skip", keep_states=True) as launches:
        example.op.__wrapped__(*example.make_inputs())
    (kept,) = launches.kept.values()
    assert "tritongrad_tl." in jit_src(kept.kernel) and "tritongrad_tg." in jit_src(kept.kernel)
    contained = self_contained(kept.kernel)
    src = jit_src(contained)
    assert not re.search(r"\btritongrad_t[lg]\b", src) and "tl.pointer_type(" in src
    for name in set(re.findall(r"\btg_\w+", src)):
        assert contained.fn.__globals__[name].fn.__name__ == name


def test_a_kernel_made_self_contained_takes_its_float_arguments_as_float32():
    """Inductor types a Python float argument float64 where Triton types it float32: the kernels tritongrad makes
    cast such parameters to float32 first, so a compiled graph computes as the eager launch does (and at its speed)."""
    import triton
    import triton.language as tl

    from tritongrad.codegen.generate import jit_source, jit_src, self_contained

    kernel = jit_source("@triton.jit\ndef scaled(x_ptr, y_ptr, scale, n, BLOCK: tl.constexpr):\n"
                        "    i = tl.arange(0, BLOCK)\n"
                        "    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * scale, mask=i < n)\n",
                        "scaled", {"triton": triton, "tl": tl})
    contained = self_contained(kernel, ("scale",))
    assert contained is self_contained(kernel, ("scale",)) and contained is not self_contained(kernel)
    lines = jit_src(contained).splitlines()
    assert lines[1].strip() == "scale = tl.cast(scale, tl.float32)" and lines[2].strip().startswith("i = tl.arange")
    x = torch.randn(37, dtype=torch.float32)
    y = torch.empty_like(x)
    contained[(1,)](x, y, 0.3, 37, BLOCK=64)
    torch.testing.assert_close(y, x * 0.3)
