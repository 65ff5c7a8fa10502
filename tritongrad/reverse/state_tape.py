"""A nonlinear loop's state tape: the backward kernel's raw-byte scratch parameters for the carried state at the
start of each iteration (or after the loop: its finals), how a launch sizes them (a slot per iteration where the
tape fits its budget, checkpoints otherwise), and the helper that types a tape row."""

from __future__ import annotations

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
    dtypes: tuple[str | None, ...] = ()  # each state's dtype as its source creates it (`COMPUTE`, `tl.float32`)

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
        budget = tape_budget(device)
        slots = max(1, min(trips if trips is not None else MAX_SLOTS, budget // (per_slot * max(programs, 1))))
        args = {param: torch.empty(max(1, programs * slots * n), dtype=torch.uint8, device=device)
                for param, n in sizes.items()}
        args[self.slots] = slots
        return args

    def state_bytes(self, launch: LaunchValues) -> dict[str, int]:
        """Per tape parameter, the bytes of one slot of its state on a launch: 8 per element (the widest
        type) where the source does not say the state's type."""
        dtypes = self.dtypes or (None,) * len(self.states)
        return {param: launch.numel(shape) * _itemsize(dtype, launch)
                for (param, shape), dtype in zip(self.states, dtypes, strict=True)}

    def known_trips(self, launch: LaunchValues) -> int | None:
        try:
            return max(0, int(self.trips.evaluate(launch))) if self.trips is not None else None
        except Exception:
            return None


def tape_row(dtype: str | None) -> str:
    """The helper (language.py) that types a state's tape row: its own type where its source says it, else float64
    (its value may widen in the loop: a literal ``0.0`` carrying float64 sums in the interpreter)."""
    return "tape_row" if dtype is not None else "tape_row_wide"


def _itemsize(dtype: str | None, launch: LaunchValues) -> int:
    """Bytes per element of a dtype as written: `tl.float32`, or a constexpr the launch gives (a triton or
    torch dtype); 8 where it is not known."""
    import triton.language as tl

    if dtype is None:
        return 8
    value = getattr(tl, dtype[3:], None) if dtype.startswith("tl.") else launch.arguments.get(dtype)
    bits = getattr(value, "primitive_bitwidth", None)
    if isinstance(bits, int) and bits >= 8:
        return bits // 8
    size = getattr(value, "itemsize", None)
    return size if isinstance(size, int) and size > 0 else 8


def tape_budget(device) -> int:
    """The bytes a launch's tapes (and a persistent backward's partial rows: strategies.rows_fit) may take on
    ``device``."""
    import torch

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return min(TAPE_BUDGET, cuda_properties(device).total_memory // TAPE_SHARE)
    return min(TAPE_BUDGET, 256 << 20)
