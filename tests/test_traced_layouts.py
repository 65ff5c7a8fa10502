"""The compiled backward is planned from fake tensors (ops/library.py's traced backward): a storage stands for the
address fake tensors lack (core/device.py). What the plan reads of a call's tensors (tape.py's key: storages
numbered in order of appearance, layouts) and the overlap facts the write strategies check must be the same as for
the real tensors, for every binding users pass; else the traced backward would pick strategies for other memory."""

import contextlib
import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from tritongrad.core import device
from tritongrad.ops.call_tensors import CallTensors
from tritongrad.writes.launch_facts import Layout, overlap


def bound(binding: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(39)
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
