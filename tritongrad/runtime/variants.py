"""A backward kernel's variants (one way of writing each input's gradient: its kernels, ``Part``) and what one launch
of them makes: partial rows, scratch, the launch as a backward keeps it to make again."""

from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from ..analysis.launch_values import Expr, LaunchValues
from ..core.device import compiled_multiprocessors
from ..reverse.state_tape import StateTape
from ..writes.strategies import Choice, LaterAdds, span_of
from . import tuning
from .guards import Banded, banded, check_bands, fill_bands, kernel_name


def shadow_dtype(dtype: Any) -> Any:
    """The dtype of a gradient buffer for a primal of ``dtype``: float32 for half types."""
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(eq=False)
class Prepared:
    """What launches with the same arguments share: how each input's gradient is written, the compiled
    variant for that, and its kernels' tuned launch settings (one per part) once the first launch has timed them."""

    choices: dict[str, Choice]
    variant: Variant  # reading the state tapes the forward kept (augment.py) where its parts are ``saved``
    shared: frozenset[str] = frozenset()  # inputs whose buffers overlap another's (launch_facts.py): written after
    # the kernels (partial rows, kernels of their own) or into buffers of their own (``private``)
    settings: tuple[tuning.Setting, ...] | None = None

    @functools.cached_property
    def private(self) -> tuple[str, ...]:
        """Inputs stored into buffers of their own, added to theirs after the kernels (in this order)."""
        return tuple(p for p, c in self.choices.items() if c.private)

    @functools.cached_property
    def covered_rows(self) -> frozenset[str]:
        """Inputs summed in registers whose loads cover the tensor: each program stores its whole partial row
        (a launch's choice: the variant's code is the same either way)."""
        return frozenset(p for p, c in self.choices.items() if c.strategy.rows_unfilled(c))


@dataclass(frozen=True)
class Part:
    """One kernel of a variant: the gradients of ``wrt``, launched with the forward's grid, except along
    ``axis`` (a persistent kernel: a few programs per multiprocessor; an interchanged one: ``trips``)."""

    wrt: tuple[str, ...]
    src: str
    kernel: Any
    shadows: dict[str, str]  # output or input -> its shadow parameter in this kernel
    programs: str | None  # persistent or interchanged: the parameter holding the forward's program count
    rows: dict[str, str]  # partial inputs -> the parameter holding their partial rows' stride
    axis: int | None
    trips: Expr | None  # interchanged: the programs along ``axis`` (the trip count of the loop it takes)
    written: frozenset[str]  # inputs whose gradient it writes
    tapes: tuple[StateTape, ...] = ()  # nonlinear loops' state tapes, allocated on each launch
    later_adds: tuple[LaterAdds, ...] = ()  # loads whose adjoints are added after the kernel
    saved: bool = False  # its tapes come filled from the forward (augment.py), not allocated
    prologue: Any = None  # interchanged: the kernel computing per forward program values first (on its grid)
    exports: StateTape | None = None  # the prologue's values, allocated on each launch
    loops: bool = False  # its body has a loop (tuning also tries how many of its loads are in flight)
    stages: str | None = None  # persistent: the constexpr parameter of its loop's pipelining (setting.num_stages)
    held: str | None = None  # persistent: the constexpr parameter holding its loads across the loop (setting.held)
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # launch-time lookups, made once

    @property
    def persistent(self) -> bool:
        """A few programs per multiprocessor along ``axis`` (tuning tries several counts)."""
        return self.axis is not None and self.trips is None

    def scratch_args(self, args: dict[str, Any], grid: tuple[int, ...], checked: bool = False
                     ) -> tuple[Banded, ...]:
        """The kernel's scratch buffers for a launch on ``grid`` (state tapes, later adds), added to ``args``;
        ``checked``: each between guard bands (guards.py), returned to check after the kernel."""
        if not self.later_adds and (self.saved or not self.tapes):
            return ()
        programs, device = math.prod(grid), None  # (the device: asked where a tape is made, not for later adds)
        bands = ()
        for tape in self.tapes if not self.saved else ():
            device = device or device_of(args)
            made = tape.allocate(LaunchValues(args, grid), programs, device)
            if checked:
                made, more = banded(made, "state tape", keep=False)
                bands += more
            args.update(made)
        for later in self.later_adds:
            made = later.allocate(LaunchValues(args, grid), programs, args[self.shadows[later.param]])
            if checked:
                made, more = banded(made, "slots of adjoints added after the kernel")
                bands += more
            args.update(made)
        return bands

    def add_later(self, args: dict[str, Any], deterministic: bool) -> None:
        """After the kernel: its later loads' adjoints added into their inputs' gradients."""
        for later in self.later_adds:
            target = args[self.shadows[later.param]]
            later.add(args, target, span_of(target), deterministic)


@dataclass(frozen=True)
class PartialRows:
    """An input a persistent kernel sums in partial rows: one float32 row per program (float64 for float64),
    summed in a fixed order after the kernel into the input's gradient buffer."""

    input: str
    param: str  # the kernel's shadow parameter of the input: the rows, less their padding
    programs: int
    span: int  # the elements of the gradient buffer a row covers
    dtype: Any
    unfilled: bool  # every program stores its whole row (Prepared.covered_rows): no zero-fill
    pad: int  # a guard band on each side of a row (a checked backward looks for writes there: guards.py)
    how: str  # how the rows reach the buffer: "into" (torch.sum's out=), "add" (to gradient there), "copy"

    @staticmethod
    def of(part: Part, p: str, programs: int, target: Any, covered: bool, written: bool, pad: int) -> PartialRows:
        import torch

        dtype = torch.float64 if target.dtype == torch.float64 else torch.float32
        how = "add" if written else "into" if target.dtype == dtype and target.is_contiguous() else "copy"
        return PartialRows(p, part.shadows[p], programs, span_of(target), dtype, covered and not pad, pad, how)

    @property
    def width(self) -> int:
        return self.span + 2 * self.pad

    def allocate(self, args: dict[str, Any], device: Any) -> Any:
        """The rows (with their padding), their view without it put in ``args``."""
        fill = empty_strided if self.unfilled else zeros_strided
        rows = fill((self.programs, self.width), (self.width, 1), dtype=self.dtype, device=device)
        if self.pad:
            fill_bands(rows, self.pad)
        args[self.param] = rows[:, self.pad:] if self.pad else rows  # (slicing a tensor costs microseconds)
        return rows

    def sum(self, rows: Any, target: Any) -> None:
        """The rows summed in order into ``target``: one kernel where the sum can be written straight into it."""
        import torch

        if self.pad:
            rows = rows[:, self.pad:self.pad + self.span]
        if self.how == "into":
            torch.sum(rows, 0, out=target.view(-1))
        elif self.how == "add":
            target.add_(rows.sum(0).as_strided(target.size(), target.stride()))
        else:
            target.copy_(rows.sum(0).as_strided(target.size(), target.stride()))


@dataclass(frozen=True)
class PartLaunch:
    """One kernel of a variant launched (:meth:`BackwardKernel._run_part`), and as a backward keeps it to launch
    again with other tensors of the same layouts (host/launcher.Launcher: ``args`` then holds no tensors)."""

    part: Part
    grid: tuple[int, ...]
    args: dict[str, Any]  # its arguments but its partial rows and scratch (Part.scratch_args)
    partials: tuple[PartialRows, ...]  # the partial rows it sums into its inputs' buffers
    relauncher: Any = field(default=None, compare=False)  # relaunch.Relauncher, where kept by a backward

    def launch(self, args: dict[str, Any], buffers: dict[str, Any], deterministic: bool, reduce: bool = True,
               checked: bool = False) -> list:
        """Launch with ``args`` (its arguments but the partial rows and scratch, made here): ``reduce``: then its
        later adds and partial rows summed into ``buffers`` (not in tuning's trials); ``checked``: its scratch
        between guard bands, checked after the kernel (guards.py). Returns the partial rows."""
        rows = [r.allocate(args, buffers[r.input].device) for r in self.partials]
        part = self.part
        bands = part.scratch_args(args, self.grid, checked)
        if self.relauncher is not None:
            self.relauncher(args)
        else:
            part.kernel[self.grid](**args)
        check_bands(bands, part.kernel)
        if reduce:
            part.add_later(args, deterministic)
            for r, found in zip(self.partials, rows, strict=True):
                r.sum(found, buffers[r.input])
        return rows


@dataclass(frozen=True)
class Variant:
    """The backward kernels compiled for one way of writing each input's gradient: one for all inputs, but
    for those given a kernel of their own (``interchange``)."""

    choices: tuple[tuple[str, Choice], ...]  # wrt input -> how its gradient is written
    parts: tuple[Part, ...]
    unwritten: frozenset[str]  # inputs no kernel writes anything for: their buffers are zero-filled

    @property
    def src(self) -> str:
        return "\n\n".join(part.src for part in self.parts)

    def writer(self, p: str) -> str:
        """The name of the kernel writing input ``p``'s gradient."""
        return next((kernel_name(part.kernel) for part in self.parts if p in part.wrt), "none: no gradient reaches it")

    @functools.cached_property
    def reads(self) -> frozenset[str]:
        """The parameters whose memory a kernel of it reads (not only their addresses): an op need not keep a
        tensor for the others (host/backward.py passes a stand-in)."""
        sources = [part.src for part in self.parts] + [part.prologue.src for part in self.parts
                                                        if getattr(part.prologue, "src", None)]
        return frozenset().union(*(params_read(src) for src in sources))

    @functools.cached_property
    def reads_saved(self) -> bool:
        """Whether a kernel reads the state tapes the forward kept."""
        return any(part.saved for part in self.parts)

    @property
    def kernel(self) -> Any:
        return self.parts[0].kernel

    @property
    def persistent(self) -> bool:
        """Whether a kernel runs a few programs per multiprocessor (tuning tries several counts)."""
        return any(part.persistent for part in self.parts)


def device_of(args: dict[str, Any]) -> Any:
    """The device of a launch's first tensor argument."""
    return next((v.device for v in args.values() if hasattr(v, "device") and hasattr(v, "data_ptr")), None)


def zeros_strided(size, stride, dtype, device):
    import torch

    return torch.empty_strided(size, stride, dtype=dtype, device=device).zero_()


def empty_strided(size, stride, dtype, device):
    import torch

    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def reads_only(variant: Variant, tapes: tuple[StateTape, ...]) -> bool:
    """Whether the tapes a variant's kernels read are among those a forward kept, by the forward's programs."""
    kept = {tape.key: tape for tape in tapes}
    if variant.persistent:
        return False  # a persistent kernel's programs are not the forward's (its state tapes' rows)
    return all(tape.key in kept and kept[tape.key].holds(tape)
               for part in variant.parts if part.saved for tape in part.tapes)


def tape_args(part: Part, saved: Any) -> dict[str, Any]:
    """A kernel's arguments for the tapes it reads: the forward's (augment.SavedStates), by its own parameter
    names (each kernel of a variant names them itself)."""
    key = ("tapes", *[tape.key for tape in saved.tapes])
    names = part.memo.get(key)
    if names is None:
        kept = {tape.key: tape for tape in saved.tapes}
        names = []
        for tape in part.tapes:
            there = kept[tape.key]
            names.append((tape.slots, there.slots))
            held = there.held()
            names += [(param, held[source][0]) for source, (param, _, _) in tape.held().items()]
        names = part.memo[key] = tuple(names)
    return {mine: saved.args[theirs] for mine, theirs in names}


def persistent_programs(programs: int, device: Any, waves: int = 1) -> int:
    """How many programs a persistent backward runs along its axis: ``waves`` per multiprocessor on a GPU
    (each keeps a partial row); a few in Triton's interpreter, so that each program loops over several."""
    count = compiled_multiprocessors(device)
    return max(1, min(programs, waves * count if count else 3))


# tg helpers that read no memory (their operands' values or shapes only)
_PURE_HELPERS = frozenset({"widened", "cast_grad", "unbroadcast", "zeros_grad", "split_grad"})


def params_read(src: str) -> frozenset[str]:
    """The parameters of the kernels in ``src`` through which memory is read (or written): each name is followed to
    the parameters it is computed from, and a load, atomic, store or ``tg`` helper call (but the pure ones) reading a
    name reads through those parameters. Conservative: a value computed from a loaded one counts as its pointer's."""
    found: set[str] = set()
    for fn in (n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)):
        origin = {a.arg: {a.arg} for a in fn.args.args}
        flows = []  # (target names, the names its value reads)
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                flows.append(({n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)},
                              _names(node.value)))
            elif isinstance(node, ast.For):
                flows.append(({n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}, _names(node.iter)))
        changed = True
        while changed:
            changed = False
            for targets, reads in flows:
                sources = set().union(*(origin.get(n, ()) for n in reads))
                for t in targets:
                    if not sources <= origin.setdefault(t, set()):
                        origin[t] |= sources
                        changed = True
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and _touches_memory(node.func):
                arguments = [*node.args, *(k.value for k in node.keywords)]
                found |= set().union(*(origin.get(n, ()) for a in arguments for n in _names(a)))
    return frozenset(found)


def _names(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


def _touches_memory(func: ast.expr) -> bool:
    text = ast.unparse(func)
    if text.startswith("tg.") or text.startswith("tg_"):
        return text.removeprefix("tg.").removeprefix("tg_") not in _PURE_HELPERS
    leaf = text.rsplit(".", 1)[-1]
    return leaf in ("load", "store", "gather", "scatter") or leaf.startswith("atomic_")
