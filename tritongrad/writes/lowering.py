"""How each differentiated input's gradient reaches memory: the seam between the reverse sweep and memory.

The adjoint of a load is a scatter into the input's shadow. Per ``wrt`` input, the best of these
that can be shown right is used (at derivation where it is certain, at launch where it depends on
the launch's strides, sizes, grid and trip counts):

- ``store``: each address the input's load reads is reached once in the whole launch (its lanes,
  programs and loop iterations apart, as lanes.py shows for stores). The adjoint is a plain
  ``tl.store`` in the input's dtype: no atomics, no float32 buffer, no cast pass; and where the load
  reaches every element of the tensor (``covers``), no zero-fill either. When an earlier writer in
  the backward already put gradient there (another launch of an op, or a caller's buffer), it is
  ``add``: load, add, store, still without atomics.
- ``partials``: every program along a grid axis reads the same addresses (a weight, a bias). The
  backward runs persistently along that axis: each program loops over the forward's programs,
  accumulating the input's adjoint in registers (``registers``: where its addresses and mask do not
  move) or in its own float32 row (``row``), and a fixed-order sum reduces the rows afterwards
  (deterministic, as hand-written norm backwards do).
- ``interchange``: every program along a grid axis reads the same addresses, but a loop moves them (a
  matmul's ``A[m, k]`` under ``for k``, read by every program along ``n``). The input gets a kernel of its
  own whose programs along that axis are the loop's iterations, each looping over the forward's programs
  along the axis and storing its tile once (interchange.py): the loop interchange of a hand-written
  matmul or attention backward.
- ``store`` with *later adds*: an input loaded by several statements, one of them owned as above (a
  cross-entropy's row, read block by block) and the others outside loops (its target's logit). The
  owned load's adjoint is stored; each other load's is kept, with its addresses, in a small buffer of
  its own per program and added after the kernel (:class:`LaterAdds`): wherever those addresses point,
  the stores are done by then.
- ``atomic``: anything else (gathers, overlapping windows, several loads of one input in loops):
  ``tl.atomic_add`` into a zero-filled float32 buffer.
- ``none``: the input's value does not reach an output: its gradient is zero.

:class:`Lowering` holds, per input, the conditions each strategy needs (``checks.py`` data);
``choose`` evaluates them on a launch; ``persistent`` rewrites a backward body for partial rows.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis.addresses import (
    Lane,
    LoopIndex,
    ProgramDigit,
    ProgramId,
    enclosing_loops,
    form_of_terms,
    mask_bounds,
    starts_at_zero,
)
from ..analysis.analyze import Analysis, loaded_values, program_axes
from ..analysis.conditions import UNKNOWN_TRIP, All, AtMost, Condition, Covers, Expr, LaunchValues
from ..analysis.lanes import launch_coordinates, scalars_written_out
from ..core.ir import (
    arguments,
    child_blocks,
    definitions,
    op_of,
    program_axis,
    reads,
    statements,
    target_of,
)
from ..core.operations import operation_of
from .launch_facts import LaunchFacts

ATOMIC, STORE, ADD, REGISTERS, ROW, NONE = "atomic", "store", "add", "registers", "row", "none"
INTERCHANGE = "interchange"
PARTIALS = (REGISTERS, ROW)
AXES = (0, 1, 2)


@dataclass(frozen=True)
class InputLowering:
    """What can be shown about one ``wrt`` input's load, for choosing how its adjoint is written."""

    param: str
    owned: Condition | None = None  # every address reached once in the launch (None: never shown)
    covers: Condition | None = None  # (with owned) every element of the tensor reached
    shared: dict[int, Condition] = field(default_factory=dict)  # axis -> its lanes apart, the other axes single
    in_registers: frozenset[int] = frozenset()  # axes along which the load's address and mask do not move
    why: str = ""  # why it cannot be stored, for ``tritongrad show``
    apart: Condition | None = None  # the part of ``owned`` about lanes, programs and iterations (for show)
    inactive: bool = False  # its value reaches no output: no gradient
    interchange: dict[int, Condition] = field(default_factory=dict)  # axis -> its loop's iterations apart
    trips: Expr | None = None  # (interchange) the trip count of the loop around the load
    later: tuple[str, ...] = ()  # (with owned) the other loads' results, outside loops: added after the kernel
    fill: str = ""  # (with covers) the load's result, in a branch of an if: the other branch stores zeros there

    def describe(self) -> str:
        """What ``tritongrad show`` says of it."""
        if self.inactive:
            return f"{self.param}: its value reaches no output, so its gradient is zero"
        parts = []
        for axis in self.interchange:
            parts.append(f"the programs along axis {axis} read the same elements, moved by the loop around the "
                         f"load: a kernel of its own, one program per iteration of the loop ({self.trips}) and "
                         "tile, each summing over the forward's programs along the axis in registers and storing "
                         "its tile once")
        for axis in self.shared:
            where = "in registers" if axis in self.in_registers else "in its own float32 row"
            parts.append(f"the programs along axis {axis} read the same elements: a persistent loop over them, "
                         f"each program summing their gradient {where}, the sums added in a fixed order")
        if self.owned is not None:
            when = "" if self.apart is None or self.apart == All() else f" ({self.apart})"
            single = " and with one program along axis " + ", ".join(map(str, self.shared)) if self.shared else ""
            parts.append(f"stored where each element is reached once{when}{single}"
                         + (", without a zero-fill where the loads cover the tensor" if self.covers else "")
                         + (" (the programs that take the other branch of the `if` around it store zeros there)"
                            if self.fill else "")
                         + (f"; the adjoints of its other loads ({', '.join(f'`{n}`' for n in self.later)}) "
                            "kept per program and added after the kernel" if self.later else ""))
        parts.append("else added atomically" + (f": {self.why}" if self.why and not parts else ""))
        return f"{self.param}: " + "; ".join(parts)


@dataclass(frozen=True)
class Choice:
    """How one launch writes one input's gradient."""

    mode: str  # STORE / ADD / REGISTERS / ROW / INTERCHANGE / ATOMIC
    axis: int | None = None  # partials: the persistent axis; interchange: the axis the loop's iterations take
    covers: bool = False  # store, registers: the load reaches every element (buffer, partial rows: no zero-fill)
    later: tuple[str, ...] = ()  # store, add: the input's other loads, added after the kernel (LaterAdds)
    fill: str = ""  # store covering the tensor: the load (by result) whose if's other branch stores zeros
    private: bool = False  # store: into a buffer of its own, added to the input's after the kernels (its
    # buffer overlaps another input's: launch_facts.py)


@dataclass(frozen=True)
class Lowering:
    inputs: dict[str, InputLowering]

    def choose(self, facts: LaunchFacts, deterministic: bool = False) -> dict[str, Choice]:
        """Each input's choice for a launch, from its facts (launch_facts.py): the conditions of each strategy
        evaluated on its scalars and grid; a buffer reaching one element from several positions (stride 0)
        added atomically; one overlapping another input's stored into a buffer of its own (``private``) or, for
        partial rows and kernels of their own, which write after the kernel, added there (the launcher treats
        it as ``written``). At most one persistent axis per launch: the first input's that wants one. An input
        gets a kernel of its own where that has at least ``facts.parallel`` programs (a GPU's multiprocessors: a
        layer norm's bias over four column blocks would run four long programs), and partial rows where they
        take at most ``facts.row_budget`` bytes (:func:`rows_fit`). ``deterministic``: a kernel of its own
        however few programs it has, rather than atomics."""
        launch, parallel = facts.values, facts.parallel
        choices: dict[str, Choice] = {}
        axis = None
        for param, lowering in self.inputs.items():
            if lowering.inactive:
                choices[param] = Choice(NONE)
                continue
            if param in facts.self_overlapping:
                choices[param] = Choice(ATOMIC)
                continue
            if _holds(lowering.owned, launch):
                if param in facts.shared:  # another input's gradient lands in this memory too: a buffer of its own
                    covers = _holds(lowering.covers, launch)
                    choices[param] = Choice(STORE, covers=covers, later=lowering.later,
                                            fill=lowering.fill if covers else "", private=True)
                elif param in facts.written:
                    choices[param] = Choice(ADD, later=lowering.later)
                else:
                    covers = _holds(lowering.covers, launch)
                    choices[param] = Choice(STORE, covers=covers, later=lowering.later,
                                            fill=lowering.fill if covers else "")
                continue
            interchange = [a for a, c in lowering.interchange.items() if _holds(c, launch) and launch.programs(a) > 1
                           and (deterministic or _programs(launch, a, lowering.trips) >= parallel)]
            if interchange:
                choices[param] = Choice(INTERCHANGE, interchange[0], _holds(lowering.covers, launch))
                continue
            shared = [a for a, c in lowering.shared.items() if axis in (None, a) and _holds(c, launch)
                      and launch.programs(a) > 1 and rows_fit(launch, param, a, facts)]
            if shared:
                axis = shared[0]
                if axis in lowering.in_registers:  # each program stores its whole row once, after its loop
                    choices[param] = Choice(REGISTERS, axis, covers=_holds(lowering.covers, launch))
                else:
                    choices[param] = Choice(ROW, axis)
                continue
            choices[param] = Choice(ATOMIC)
        return _without_later_adds(choices, axis)

    def without_interchange(self, param: str) -> Lowering:
        """The same, with ``param``'s gradient never given a kernel of its own (its body cannot be)."""
        inputs = dict(self.inputs)
        inputs[param] = replace(inputs[param], interchange={}, trips=None)
        return Lowering(inputs)

    def best(self) -> dict[str, Choice]:
        """What a typical launch gets (several programs along each axis the kernel reads): the kernel
        ``tritongrad show`` prints."""
        choices, axis = {}, None
        for param, lowering in self.inputs.items():
            if lowering.inactive:
                choices[param] = Choice(NONE)
            elif lowering.interchange:
                choices[param] = Choice(INTERCHANGE, min(lowering.interchange), lowering.covers is not None)
            elif lowering.shared and (axis is None or axis in lowering.shared):
                axis = axis if axis is not None else min(lowering.shared)
                in_registers = axis in lowering.in_registers
                choices[param] = Choice(REGISTERS if in_registers else ROW, axis,
                                        covers=in_registers and lowering.covers is not None)
            elif lowering.owned is not None:
                choices[param] = Choice(STORE, covers=lowering.covers is not None, later=lowering.later,
                                        fill=lowering.fill)
            else:
                choices[param] = Choice(ATOMIC)
        return _without_later_adds(choices, axis)


def rows_fit(launch: LaunchValues, param: str, axis: int, facts: LaunchFacts) -> bool:
    """Whether ``param``'s partial rows along ``axis`` take at most ``facts.row_budget`` bytes: a row as long as the
    tensor's span per persistent program (at most ``facts.persistent_programs``). A weight's rows are small; an
    attention's keys, read by every query block, would take that many copies of all heads' keys."""
    tensor = launch.arguments.get(param)
    if facts.row_budget is None or not hasattr(tensor, "stride"):
        return True
    programs = min(launch.programs(axis), facts.persistent_programs)
    return programs * span_of(tensor) * (8 if tensor.element_size() == 8 else 4) <= facts.row_budget


def span_of(t: Any) -> int:
    """How many elements from a tensor's first one its last one lies (its shadow's partial row length)."""
    if t.numel() == 0:
        return 1
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def _without_later_adds(choices: dict[str, Choice], axis: int | None) -> dict[str, Choice]:
    """A persistent kernel (partial rows along ``axis``) runs other programs than the forward's, whose slots
    later adds keep: an input with later adds is added atomically there."""
    if axis is None:
        return choices
    return {p: Choice(ATOMIC) if c.later and c.mode in (STORE, ADD) else c for p, c in choices.items()}


@dataclass(frozen=True)
class LaterAdds:
    """A load whose adjoint is added after the kernel (an input's other loads, beside the one stored): each
    program keeps the adjoint of its lanes with their addresses' offsets from the gradient's first element
    (tg.add_later), zero where it did not run the load; the BackwardKernel then adds them in."""

    param: str  # the wrt input
    values: str  # the kernel's parameter: a slot per program and lane, in the gradient's type (index_add_ adds
    # in it: the kernel's store rounds as a cast before it would)
    offsets: str  # the kernel's parameter: the lanes' element offsets (int64)
    shape: tuple[str, ...]  # the load's tile, as written

    def allocate(self, launch: LaunchValues, programs: int, target) -> dict[str, object]:
        import torch

        n = max(1, programs * launch.numel(self.shape))
        both = torch.zeros(n * (8 + target.element_size()), dtype=torch.uint8, device=target.device)  # one fill
        return {self.offsets: both[:8 * n].view(torch.int64), self.values: both[8 * n:].view(target.dtype)}

    def add(self, args: dict, target, span: int, deterministic: bool) -> None:
        """Add the kept adjoints into ``target`` (``span`` elements from its first one to its last)."""
        import torch

        flat = target.as_strided((span,), (1,))
        values, offsets = args[self.values], args[self.offsets]
        if deterministic and target.is_cuda and not torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(True)  # index_add_ on CUDA adds in a fixed order then
            try:
                flat.index_add_(0, offsets, values)
            finally:
                torch.use_deterministic_algorithms(False)
        else:
            flat.index_add_(0, offsets, values)


def most_trips(trips: Expr, launch: LaunchValues, axis: int) -> int:
    """The most iterations any of the forward's programs along ``axis`` runs: the programs an input's own kernel
    runs along it (a count that reads the program id, a causal attention's, is evaluated for each)."""
    if not trips.program_axes():
        return trips.evaluate(launch)
    return max((trips.evaluate(replace(launch, program=(axis, p))) for p in range(launch.programs(axis))), default=0)


def _programs(launch: LaunchValues, axis: int, trips: Expr) -> int:
    """How many programs an input's own kernel runs: the grid with the loop's iterations along ``axis``."""
    try:
        count = most_trips(trips, launch, axis)
    except Exception:
        return 0
    for a, n in enumerate(launch.grid or ()):
        count *= n if a != axis else 1
    return count


def _holds(condition: Condition | None, launch: LaunchValues) -> bool:
    """A condition that cannot be evaluated (a value the launch does not give) counts as false: the safe way."""
    if condition is None:
        return False
    try:
        return condition.holds(launch)
    except Exception:
        return False


# -- what can be shown about each input ---------------------------------------------------------------

def plan_lowering(a: Analysis) -> Lowering:
    """Per ``wrt`` input, the conditions of each strategy (static facts and launch conditions)."""
    body = a.program.body
    used = {program_axis(s) for s in statements(body)} - {None}
    context = _Context(a, definitions(body), enclosing_loops(body), _nesting(body), loaded_values(body),
                       program_axes(body), set(AXES) if -1 in used else used, program_axes(body, through_stop=False))
    inputs = {p: context.input(p) for p in a.wrt}
    for p in a.in_place:  # its shadow holds the new values' gradient: written where loaded, no partial rows
        if inputs[p].later:  # (zeroed and refilled where stored: one load, one place)
            inputs[p] = InputLowering(p, why="it is loaded by several statements")
        inputs[p] = replace(inputs[p], covers=None, shared={}, in_registers=frozenset())
    if a.in_place:  # one kernel: every input's adjoint reads the new values' gradient before it is replaced
        inputs = {p: replace(lowering, interchange={}, trips=None) for p, lowering in inputs.items()}
    return Lowering(inputs)


@dataclass
class _Context:
    a: Analysis
    defs: dict
    around: dict  # id(stmt) -> the loops around it
    nested: dict  # id(stmt) -> the structured nodes around it
    loaded: set  # names computed from loaded data
    axes_of: dict  # name -> the program axes its value depends on
    used: set  # the program axes the kernel reads
    iteration_axes: dict  # name -> the axes its value depends on in one iteration (not how many iterations run)

    def input(self, param: str) -> InputLowering:
        a = self.a
        loads = [s for s in a.loads.get(param, []) if target_of(s) in a.active]
        if not loads:
            return InputLowering(param, inactive=True)
        if len(loads) == 1:
            return self.load(param, loads[0])
        in_loops = [s for s in loads if any(isinstance(n, ast.For) for n in self.nested[id(s)])]
        if len(in_loops) <= 1:  # the one in a loop (else any) stored, the others added later
            for stmt in in_loops or loads:
                later = [s for s in loads if s is not stmt]
                owned = self.load(param, stmt)
                if owned.owned is not None and all(self._addable_later(s) for s in later):
                    return replace(owned, shared={}, in_registers=frozenset(), interchange={}, trips=None,
                                   later=tuple(target_of(s) for s in later))
        return InputLowering(param, why="it is loaded by several statements")

    def _addable_later(self, stmt: ast.stmt) -> bool:
        """Whether a load outside loops can keep its adjoint per program (a pointer load of rank 2 at most)."""
        shape = self.a.shapes.get(target_of(stmt))
        return shape is not None and len(shape) <= 2 and not operation_of(op_of(stmt)).descriptor

    def load(self, param: str, stmt: ast.stmt) -> InputLowering:
        """What can be shown about ``param`` loaded by ``stmt`` alone."""
        a = self.a
        if operation_of(op_of(stmt)).descriptor:
            return InputLowering(param, why="a tensor descriptor's load")
        b = arguments(stmt)
        pointer = b["pointer"].id
        shape = a.shapes.get(pointer)
        form = a.forms.get(pointer)
        if shape is None or (form is not None and not form.affine):
            return InputLowering(param, why="its lanes' addresses are not an affine form")
        if any(n in self.loaded for n in _closure([pointer], self.defs)):
            return InputLowering(param, why="its addresses are computed from loaded data")
        terms = dict(form.terms) if form is not None else {}
        around = self.around[id(stmt)]
        terms = {k: c for k, c in terms.items() if not isinstance(k, LoopIndex) or k in around}
        if any(extent != "1" and Lane(axis) not in terms for axis, extent in enumerate(shape)):
            return InputLowering(param, why="lanes along an axis of its tile read the same element")
        bounds = mask_bounds(b["mask"], a.forms, self.defs, a.shapes) or []
        found = launch_coordinates(form_of_terms(terms, len(shape)), shape, bounds, a.trips)
        if found is None:
            return InputLowering(param, why="a trip count or stride the launch cannot give")
        apart = found.apart() if len(found.keys) > 1 or _runtime_stride(terms) else All()  # one coordinate: a
        # stride the launch gives may be 0 (an expanded tensor's)
        present = {k.axis for k in terms if isinstance(k, ProgramId)}
        present |= {k.axis for k in terms if isinstance(k, ProgramDigit) and ProgramDigit(
            k.axis, k.divisor, not k.quotient) in terms}
        hidden = set(self.axes_of.get(pointer, set())) - present  # axes its address depends on, not as a coordinate
        absent = [axis for axis in AXES if axis not in present]
        single = {axis: AtMost(Expr("grid", (axis,)), 1) for axis in absent}
        written = lambda c: scalars_written_out(c, a.program.body)  # noqa: E731
        owned = None
        if all(loop in terms for loop in around):
            owned = written(All((apart, *single.values())))
        covers, fill = None, ""
        exact = mask_bounds(b["mask"], a.forms, self.defs, a.shapes, exact=True)
        branched = any(isinstance(n, ast.If) for n in self.nested[id(stmt)])
        if (owned is not None and exact is not None and found.exact and self._starts_at_zero(pointer, param)
                and (not branched or self._fillable(stmt, b))):
            covers = written(Covers(found.coordinates, found.bounds, param))
            fill = target_of(stmt) if branched else ""
        lanes_only = launch_coordinates(form_of_terms({k: c for k, c in terms.items() if isinstance(k, Lane)},
                                                      len(shape)), shape, [], a.trips)
        lanes_apart = lanes_only.apart() if lanes_only is not None and (len(lanes_only.keys) > 1 or _runtime_stride(
            {k: c for k, c in terms.items() if isinstance(k, Lane)})) else All()
        shared = {axis: written(All((lanes_apart, *[single[b] for b in absent if b != axis])))
                  for axis in absent if axis not in hidden and axis in self.used}
        in_registers = frozenset(axis for axis in shared if self._invariant(stmt, b, axis))
        interchange, trips = {}, None
        in_one_loop = [isinstance(n, ast.For) for n in self.nested[id(stmt)]] == [True]
        if in_one_loop and around[0] in terms:
            trips = a.trips.get(around[0])
            if trips == Expr.const(UNKNOWN_TRIP):  # which iterations run may depend on the program (causal)
                trips = a.program_trips.get(around[0])
            varies = trips.program_axes() if trips is not None else set()
            moved = set(self.iteration_axes.get(pointer, set())) - present  # each iteration's address, not how many
            axes = [axis for axis in absent if axis in self.used and axis not in moved and varies <= {axis}]
            if trips is not None:
                interchange = {axis: written(All((apart, *[single[b] for b in absent if b != axis])))
                               for axis in axes}
        why = "" if owned is not None else "its address repeats across the iterations of a loop around it"
        return InputLowering(param, owned, covers, shared, in_registers, why, written(apart), interchange=interchange,
                             trips=trips if interchange else None, fill=fill)

    def _fillable(self, stmt: ast.stmt, b: dict) -> bool:
        """Whether the programs taking the other branch of the ``if`` around a load can store zeros at its
        addresses, computing them as its branch does: one ``if`` at the kernel's top level, only loops inside
        it, and the address and mask computed from names assigned once, there or before the ``if``, or from
        those loops' indices. (Where the loads cover the tensor, those addresses lie in it whatever the
        branch: the programs that skip the load then write zeros in place of a zero-fill.)"""
        nested = self.nested[id(stmt)]
        if len(self.defs.get(target_of(stmt), [])) != 1:  # (the backward finds the load by its result)
            return False
        if not (isinstance(nested[0], ast.If) and not self.nested[id(nested[0])]
                and all(isinstance(n, ast.For) for n in nested[1:])):
            return False
        for name in _closure([n.id for n in (b["pointer"], b["mask"]) if isinstance(n, ast.Name)], self.defs):
            defs = self.defs.get(name, [])
            if len(defs) > 1:
                return False
            if defs and isinstance(defs[0], ast.For):
                if defs[0] not in nested[1:]:
                    return False
            elif defs and self.nested[id(defs[0])] != nested[:len(self.nested[id(defs[0])])]:
                return False
        return True

    def _starts_at_zero(self, pointer: str, base: str) -> bool:
        """Whether the pointer is ``base`` plus offsets with no constant part (so its addresses start at the
        tensor's first element)."""
        name = pointer
        for _ in range(64):
            if name == base:
                return True
            defs = [d for d in self.defs.get(name, []) if target_of(d) is not None and not (  # but `p = p + step`
                op_of(d).kind == "add" and any(isinstance(x, ast.Name) and x.id == name for x in op_of(d).args[:2]))]
            if len(defs) != 1:
                return False
            op = op_of(defs[0])
            pointers = [x for x in op.args if isinstance(x, ast.Name) and self.a.pointer_base.get(x.id) == base]
            if op.kind == "add" and len(pointers) == 1:
                other = op.args[1] if op.args[0] is pointers[0] else op.args[0]
                if not starts_at_zero(other, self.defs):
                    return False
            elif not (operation_of(op).pointer_args == (0,) and op.kind != "sub" and pointers):
                return False
            name = pointers[0].id
        return False

    def _invariant(self, stmt: ast.stmt, b: dict, axis: int) -> bool:
        """Whether the load, its address and its mask can be computed once per program of a persistent
        loop along ``axis``: at the kernel's top level, from top-level values independent of the axis."""
        if self.nested[id(stmt)]:
            return False
        names = _closure([n.id for n in (b["pointer"], b["mask"]) if isinstance(n, ast.Name)], self.defs)
        for n in names:
            for d in self.defs.get(n, []):
                if isinstance(d, ast.For) or self.nested.get(id(d)):
                    return False
            if axis in self.axes_of.get(n, set()):
                return False
        return True


def _runtime_stride(terms: dict) -> bool:
    """Whether a coordinate's stride is a value the launch gives (not a literal): 0 reaches one element."""
    return any(symbols for _, symbols in terms.values())


def _closure(names: list[str], defs: dict) -> set[str]:
    """The names and everything they are computed from."""
    seen: set[str] = set()
    work = list(names)
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        for d in defs.get(n, []):
            work += list(reads(d.value) if isinstance(d, ast.Assign) else reads(d.iter))
    return seen


def _nesting(body: list[ast.stmt], around: tuple = ()) -> dict[int, tuple]:
    """For each statement (structured ones included), the ``if`` and ``for`` nodes around it."""
    found = {}
    for s in body:
        found[id(s)] = around
        for block in child_blocks(s):
            found.update(_nesting(block, (*around, s)))
    return found
