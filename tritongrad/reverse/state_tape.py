"""A nonlinear loop's state tape: the backward kernel's raw-byte scratch parameters for the carried state at the
start of each iteration (or after the loop: its finals), how a launch sizes them (a slot per iteration where the
tape fits its budget, checkpoints otherwise), and the helpers that type a tape row and read it.

One rule types a state wherever it is kept: the type the forward computes it in (analysis/value_types.py, spelled
for the kernel). The backward's rows, the augmented forward's (runtime/augment.py) and the bytes a launch gives
them all follow that one spelling; where it cannot be said, the widest type (8 bytes, float64 or int64)."""

from __future__ import annotations

import ast
import copy
import os
from dataclasses import dataclass, replace

from ..analysis.launch_values import Expr, LaunchValues
from ..core.device import cuda_properties
from ..core.ir import (
    Origin,
)

TAPE_BUDGET = int(os.environ.get("TRITONGRAD_TAPE_BUDGET", 4 << 30))  # bytes a launch's state tapes may take


TAPE_SHARE = 16  # and at most this share of the device's memory (1/16)


MAX_SLOTS = 4096  # slots per program where the trip count is not known at launch


@dataclass(frozen=True)
class StateTape:
    """A nonlinear loop's state tape: the backward kernel's parameters for it, and how a launch sizes it."""

    slots: str  # the parameter: how many states each program keeps
    states: tuple[tuple[str, tuple[str, ...]], ...]  # (its tape parameter, the state's shape as written)
    trips: Expr | None  # the loop's trip count, where the launch gives it
    loop: Origin | None = None  # the ``for`` in the user's code (augment.py finds it there)
    sources: tuple[str, ...] = ()  # each state's name in the user's code
    final: bool = False  # the state after the loop only, one slot (kept by the forward: LoopReversal.keep_finals)
    dtypes: tuple[str | None, ...] = ()  # each state's type as the forward computes it (loops.state_type)
    constexpr_slots: bool = False  # ``slots`` a constexpr parameter: a static loop's recomputations are bounded by it

    @property
    def key(self) -> tuple:
        """Which loop's tape it is, whatever a kernel names its parameters (each kernel of a variant names its own)."""
        return self.loop, self.final, self.trips

    def held(self) -> dict[str, tuple]:
        """Each state it holds, by the user's name: (its tape parameter, shape, dtype)."""
        dtypes = self.dtypes or (None,) * len(self.states)
        return {source: (param, shape, dtype)
                for source, (param, shape), dtype in zip(self.sources, self.states, dtypes, strict=True)}

    def holds(self, other: StateTape) -> bool:
        """Whether it holds every state ``other`` does, of the same loop, shape and type."""
        mine = {k: v[1:] for k, v in self.held().items()}
        return self.key == other.key and all(mine.get(k) == v[1:] for k, v in other.held().items())

    def joined(self, other: StateTape) -> StateTape:
        """One tape of the loop with the states of both (``other``'s parameters renamed where they clash)."""
        held = self.held()
        taken = {param for param, _, _ in held.values()}
        for source, (param, shape, dtype) in other.held().items():
            if source not in held:
                while param in taken:
                    param += "_"
                taken.add(param)
                held[source] = (param, shape, dtype)
        return replace(self, states=tuple((p, shape) for p, shape, _ in held.values()), sources=tuple(held),
                       dtypes=tuple(d for _, _, d in held.values()))

    def allocate(self, launch: LaunchValues, programs: int, device) -> dict[str, object]:
        """The tape's arguments for a launch of ``programs`` programs: a slot per iteration where that fits
        the budget, else as many as fit (checkpoints). Raw bytes, as many per element as the state's type has."""
        import torch

        sizes = self.state_bytes(launch)
        per_slot = max(1, sum(sizes.values()))
        trips = 1 if self.final else self.known_trips(launch)
        budget = scratch_budget(device)
        slots = max(1, min(trips if trips is not None else MAX_SLOTS, budget // (per_slot * max(programs, 1))))
        args = {param: torch.empty(max(1, programs * slots * n), dtype=torch.uint8, device=device)
                for param, n in sizes.items()}
        args[self.slots] = slots
        return args

    def type_names(self) -> set[str]:
        """The launch's arguments its states' types are spelled with (a constexpr type, a pointer's)."""
        return {n.id for d in self.dtypes if d is not None for n in ast.walk(ast.parse(d, mode="eval"))
                if isinstance(n, ast.Name) and n.id not in ("tl", "tg")}

    def state_bytes(self, launch: LaunchValues) -> dict[str, int]:
        """Per tape parameter, the bytes of one slot of its state on a launch: 8 per element (the widest
        type) where the state's type is not said."""
        dtypes = self.dtypes or (None,) * len(self.states)
        return {param: launch.numel(shape) * _itemsize(dtype, launch)
                for (param, shape), dtype in zip(self.states, dtypes, strict=True)}

    def known_trips(self, launch: LaunchValues) -> int | None:
        try:
            return max(0, int(self.trips.evaluate(launch))) if self.trips is not None else None
        except Exception:
            return None


def tape_row(dtype: str | None, tape: ast.expr, like: ast.expr, slots: ast.expr, program: ast.expr) -> ast.Call:
    """The call that makes a state's tape row (language.py) of the state's type, ``dtype`` as loops.state_type
    spells it; of the widest type where that is None."""
    args = [copy.deepcopy(a) for a in (tape, like, slots, program)]
    if dtype is None:
        return ast.Call(ast.Attribute(ast.Name("tg", ast.Load()), "tape_row_wide", ast.Load()), args, [])
    args.append(ast.parse(dtype, mode="eval").body)
    return ast.Call(ast.Attribute(ast.Name("tg", ast.Load()), "tape_row", ast.Load()), args, [])


def tape_get(dtype: str | None, row: ast.expr, slot: ast.expr, like: ast.expr) -> ast.Call:
    """The call that reads a state back from its row: in the row's type (``dtype``: the state's), or from a row of
    the widest type (``dtype`` None), in the type the reader keeps it in."""
    helper = "tape_get" if dtype is not None else "tape_get_wide"
    return ast.Call(ast.Attribute(ast.Name("tg", ast.Load()), helper, ast.Load()),
                    [copy.deepcopy(a) for a in (row, slot, like)], [])


def _itemsize(dtype: str | None, launch: LaunchValues) -> int:
    """Bytes per element of a state's type as loops.state_type spells it: `tl.float32`, a constexpr the launch
    gives (a triton or torch dtype), or the promotion of samples (at most the widest of their types, and at least
    four bytes: sums and divisions widen halves); 8 where it is not known."""
    if dtype is None:
        return 8
    tree = ast.parse(dtype, mode="eval").body
    if isinstance(tree, ast.Name) or not ast.unparse(tree).endswith(").dtype"):  # a type written out
        size = _type_size(tree, launch)
        return size if size is not None else 8
    sizes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("tl.zeros", "tl.full"):
            at = 1 if ast.unparse(node.func) == "tl.zeros" else 2
            sizes.append(_type_size(node.args[at], launch) if len(node.args) > at else None)
        elif isinstance(node, ast.keyword) and node.arg in ("dtype", "out_dtype"):
            sizes.append(_type_size(node.value, launch))
        elif isinstance(node, ast.Name) and isinstance(launch.arguments.get(node.id), (int, float)):
            sizes.append(8 if isinstance(launch.arguments[node.id], int) else 4)  # a scalar argument
    return 8 if not sizes or None in sizes else max(4, *sizes)


def _type_size(dtype: ast.expr, launch: LaunchValues) -> int | None:
    """Bytes of a type written ``tl.float32``, as a constexpr (its value: a triton or torch dtype), or as a
    pointer's element type ``x_ptr.dtype.element_ty`` (the tensor the launch passes); None where not known."""
    import triton.language as tl

    text = ast.unparse(dtype)
    if text.startswith("tl."):
        value = getattr(tl, text[3:], None)
    elif isinstance(dtype, ast.Name):
        value = launch.arguments.get(dtype.id)
    elif text.endswith(".dtype.element_ty") and isinstance(getattr(dtype.value, "value", None), ast.Name):
        value = getattr(launch.arguments.get(dtype.value.value.id), "dtype", None)
    else:
        return None
    bits = getattr(value, "primitive_bitwidth", None)
    if isinstance(bits, int) and bits >= 8:
        return bits // 8
    size = getattr(value, "itemsize", None)
    return size if isinstance(size, int) and size > 0 else None


def scratch_budget(device) -> int:
    """The bytes of scratch memory a launch's backward may take on ``device``: its state tapes, or a persistent
    backward's partial rows (``LaunchFacts.row_budget``: strategies.rows_fit)."""
    import torch

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return min(TAPE_BUDGET, cuda_properties(device).total_memory // TAPE_SHARE)
    return min(TAPE_BUDGET, 256 << 20)
