"""What a call keeps for its backward, tensor by tensor and in bytes: ``tritongrad.kept(fn, *args)``.

    report = tritongrad.kept(rmsnorm, x, w)
    print(report)            # a table: node, tensor, shape, dtype, bytes, whose memory
    report.own_bytes         # memory the call allocated only for its backward

It runs ``fn(*args, **kwargs)`` with grad enabled and walks the autograd graph from its outputs back to its
arguments. Every node's saved tensors are listed: a tritongrad op's by launch and parameter (and the state tapes
its augmented forward kept), a hand-written ``autograd.Function``'s (``ctx.save_for_backward``) and PyTorch's
own nodes' (``_saved_*``) by position, so an op and its hand-written peer are measured alike. A tensor whose
memory is an argument's or an output's costs the backward nothing the caller does not hold anyway; every other
storage is the call's own, counted once however many nodes keep it (a model keeps it until the backward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class KeptTensor:
    node: str  # the autograd node keeping it (``RmsnormBackward``)
    name: str  # ``launch #1 (`rms_fwd`) X``, ``saved #0``, ``_saved_self``, ``state tape tg_tape_0``
    shape: tuple[int, ...]
    dtype: torch.dtype
    bytes: int  # the bytes of the memory this tensor's view spans
    whose: str  # "argument #i", "output #j", "own" (the call allocated it), "not kept" (the backward reads none)
    storage: int  # its storage's address (one storage is counted once)


@dataclass
class Kept:
    """What one call keeps for its backward (see the module docstring)."""

    tensors: list[KeptTensor] = field(default_factory=list)

    @property
    def own_bytes(self) -> int:
        """Bytes the call allocated for its backward alone: each own storage once, by the span its views reach."""
        return self._spans(lambda whose: whose == "own")

    @property
    def held_bytes(self) -> int:
        """Bytes of arguments and outputs the backward holds on to (the caller's memory, kept alive longer)."""
        return self._spans(lambda whose: whose not in ("own", "not kept"))

    def _spans(self, counted) -> int:
        """Each storage of the tensors whose kind ``counted`` takes, once, by the longest span its views reach."""
        spans: dict[int, int] = {}
        for t in self.tensors:
            if counted(t.whose):
                spans[t.storage] = max(spans.get(t.storage, 0), t.bytes)
        return sum(spans.values())

    def rows(self) -> list[tuple[str, ...]]:
        return [(t.node, t.name, "x".join(map(str, t.shape)) or "()", str(t.dtype).removeprefix("torch."),
                 _mib(t.bytes), t.whose) for t in self.tensors]

    def __str__(self) -> str:
        header = ("node", "tensor", "shape", "dtype", "MiB", "whose")
        rows = [header, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.append(f"own: {_mib(self.own_bytes)} MiB; arguments and outputs held: {_mib(self.held_bytes)} MiB")
        return "\n".join(lines)


def kept(fn: Callable, *args: Any, **kwargs: Any) -> Kept:
    """Run ``fn(*args, **kwargs)`` and list what its autograd graph keeps for the backward (module docstring)."""
    inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    # where the arguments' histories begin, taken before the call: an argument it updates in place has the call's
    # node as its grad_fn after it, a view's base a node copying the view's new values in
    stops = {n for t in inputs for n in (t.grad_fn, t._base.grad_fn if t._base is not None else None) if n is not None}
    with torch.enable_grad():
        result = fn(*args, **kwargs)
    outputs = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
    owners = {_storage(t): f"argument #{i}" for i, t in reversed(list(enumerate(inputs)))}
    owners.update({_storage(t): f"output #{i}" for i, t in reversed(list(enumerate(outputs)))
                   if _storage(t) not in owners})
    report = Kept()
    for node in _nodes([t.grad_fn for t in outputs if t.grad_fn is not None], stops):
        for name, t in _saved(node):
            whose = "not kept" if t.numel() == 0 else owners.get(_storage(t), "own")  # (an empty stand-in: the
            report.tensors.append(KeptTensor(node.name(), name, tuple(t.shape), t.dtype, _span_bytes(t),  # backward
                                             whose, _storage(t)))  # does not read it)
    return report


def _nodes(roots: list, stops: set) -> Iterator[Any]:
    """The autograd nodes behind ``roots``, newest first, not past the arguments' own nodes."""
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node in seen or node in stops:
            continue
        seen.add(node)
        yield node
        stack += [n for n, _ in node.next_functions if n is not None]


def _saved(node: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A node's saved tensors, named as well as the node tells."""
    record = getattr(node, "record", None)
    plan = getattr(record, "plan", None)
    if plan is not None:  # a tritongrad op's node (ops/autograd_function.py): slots named by launch and parameter
        names: dict[int, list[str]] = {}
        for launch in plan.launches:
            for p, slot in (*launch.slots.items(), *launch.as_left.items()):
                if slot is not None:
                    names.setdefault(slot, []).append(f"{launch} {p}")
        for slot, t in enumerate(node.saved_tensors):
            yield ", ".join(names.get(slot, [f"saved #{slot}"])), t
        for index, states in _state_tapes(record):
            for p, t in states.args.items():
                if isinstance(t, torch.Tensor):
                    yield f"{plan.launches[index]} state tape {p}", t
        return
    if hasattr(node, "saved_tensors"):  # a hand-written autograd.Function
        try:
            saved = node.saved_tensors
        except RuntimeError:  # freed (a backward already ran)
            saved = ()
        for i, t in enumerate(saved):
            if isinstance(t, torch.Tensor):
                yield f"saved #{i}", t
        return
    for attr in dir(node):  # PyTorch's own nodes
        if attr.startswith("_saved_"):
            try:
                value = getattr(node, attr)
            except RuntimeError:
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    yield attr.removeprefix("_"), t


def _state_tapes(record: Any) -> Iterator[tuple[int, Any]]:
    """The state tapes a call's augmented launches kept (runtime/augment.py), by launch index."""
    kept = getattr(record, "kept", None)
    if kept:  # a replayed call's (host/replay.py FastRecord)
        yield from kept.items()
        return
    for i, launch in enumerate(getattr(record, "launches", ()) or ()):
        if getattr(launch, "saved", None) is not None:
            yield i, launch.saved


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _span_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))) * t.element_size()


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"
