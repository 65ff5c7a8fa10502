"""What can be shown about each differentiated input's loads: the facts the write strategies (strategies.py) need.

The adjoint of a load is a scatter into the input's shadow. Per ``wrt`` input, :func:`plan_writes` reads the load's
address as an affine form (analysis/addresses.py) and keeps, as conditions on a launch's scalars and grid
(analysis/conditions.py data), whether its addresses are apart across lanes, programs and iterations (``owned``),
cover the tensor (``covers``), are shared by the programs along a grid axis (``shared``: partial rows, summed in
registers where they do not move), or shared along an axis but moved by a loop (``interchange``: a kernel of its
own), or why none of these can be shown; several loads at addresses apart from one another each written once
(``together``), one written once and the others added later (``later``) as the ``fallback`` where they meet at a launch.
:class:`WritePlan` holds them for every input; its ``choose`` takes, per launch, the first strategy whose facts hold.
"""

from __future__ import annotations

import ast
import functools
import operator
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..analysis.addresses import descriptor_base, descriptor_load_form, enclosing_loops
from ..analysis.analyze import Analysis
from ..analysis.conditions import All, AtMost, Condition, Covers, decided_now
from ..analysis.flow import loaded_values, program_axes
from ..analysis.forms import Lane, LoopIndex, ProgramDigit, ProgramId, form_of_terms
from ..analysis.lanes import StoreSite, apart_whatever_launched, launch_coordinates, scalars_written_out
from ..analysis.launch_values import UNKNOWN_TRIP, Expr
from ..analysis.masks import descriptor_bounds, mask_bounds
from ..analysis.offsets import address_offsets, offset_of
from ..analysis.scalars import starts_at_zero
from ..analysis.stores import NotShifted, shifted_apart
from ..core.ir import (
    arguments,
    canonical_atom,
    child_blocks,
    computed_from,
    definitions,
    op_of,
    program_axis,
    statements,
    stored_value,
    target_of,
)
from ..core.operations import operation_of
from .launch_facts import LaunchFacts
from .strategies import Choice, choose

AXES = (0, 1, 2)


@dataclass(frozen=True)
class InputFacts:
    """What can be shown about one ``wrt`` input's load, for choosing how its adjoint is written."""

    param: str
    owned: Condition | None = None  # every address reached once in the launch (None: never shown)
    covers: Condition | None = None  # (with owned) every element of the tensor reached
    shared: dict[int, Condition] = field(default_factory=dict)  # axis -> its lanes apart, the other axes single
    in_registers: frozenset[int] = frozenset()  # axes along which the load's address and mask do not move
    why: str = ""  # why it cannot be written once, for ``tritongrad show``
    apart: Condition | None = None  # the part of ``owned`` about lanes, programs and iterations (for show)
    inactive: bool = False  # its value reaches no output: no gradient
    interchange: dict[int, Condition] = field(default_factory=dict)  # axis -> its loop's iterations apart
    trips: Expr | None = None  # (interchange) the trip count of the loop around the load
    later: tuple[str, ...] = ()  # (with owned) the other loads' results, outside loops: added after the kernel
    fill: str = ""  # (with covers) the load's result, in a branch of an if: the other branch stores zeros there
    rereads: tuple[str, ...] = ()  # the other loads' results, at this load's address in sibling loops over its
    # range: their adjoints added to its own and written once (reverse/rereads.py)
    together: tuple[str, ...] = ()  # (with owned) its loads' results, at addresses apart from one another (the two
    # halves of a row): each load's adjoint written where it is computed, as if one load
    fallback: InputFacts | None = None  # where ``owned`` fails at a launch (the loads meet): these facts instead
    hidden_axes: frozenset[int] = frozenset()  # program axes its address follows through a loop's range, not as a
    # coordinate (causal attention's keys): owned with one program along them, a store there not derivable again

    def at_launch(self, holds) -> InputFacts:
        """The facts a launch takes (``holds``: whether a condition holds at it): the fallback's where the loads
        are not apart there."""
        return self.fallback if self.fallback is not None and not holds(self.owned) else self

    def conditions(self) -> list[Condition]:
        """Every condition a launch evaluates to choose from these facts (the fallback's too)."""
        found = [c for c in (self.owned, self.covers, *self.shared.values(), *self.interchange.values())
                 if c is not None]
        return found + (self.fallback.conditions() if self.fallback is not None else [])

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
            parts.append(f"written, not added, where each element is reached once{when}{single}"
                         + (", without a zero-fill where the loads cover the tensor" if self.covers else "")
                         + (" (the programs that take the other branch of the `if` around it store zeros there)"
                            if self.fill else "")
                         + (f"; the adjoints of its other loads ({', '.join(f'`{n}`' for n in self.later)}) "
                            "kept per program and added after the kernel" if self.later else ""))
            if self.together:
                parts[-1] = parts[-1].replace("once", f"once, its loads {_names(self.together)} read as one load "
                                              "with a coordinate more", 1)
        if self.fallback is not None and self.fallback.later:
            parts.append(f"where they meet at a launch, one written once and the adjoints of the others "
                         f"({_names(self.fallback.later)}) kept per program and added after the kernel")
        parts.append("else added atomically" + (f": {self.why}" if self.why and not parts else ""))
        if self.rereads:
            parts.append(f"its loads at the same addresses in sibling loops over the same range "
                         f"({', '.join(f'`{n}`' for n in self.rereads)}) have their adjoints added to the first's and "
                         "written with it, once")
        return f"{self.param}: " + "; ".join(parts)


@dataclass(frozen=True)
class WritePlan:
    """What can be shown about each ``wrt`` input's loads (:class:`InputFacts`), and the strategies chosen from it."""

    inputs: dict[str, InputFacts]

    def choose(self, facts: LaunchFacts, deterministic: bool = False) -> dict[str, Choice]:
        """Each input's strategy on a launch (strategies.choose). ``deterministic``: a kernel of its own however
        few programs it has, rather than atomics."""
        return choose(self.inputs, facts, deterministic)

    def best(self) -> dict[str, Choice]:
        """What a typical launch gets (several programs along each axis the kernel reads): the kernel
        ``tritongrad show`` prints."""
        return choose(self.inputs, None)


class Feasibility(Protocol):
    """What only writing an input's adjoints tells of a strategy's conditions (reverse/feasibility.py answers it):
    why the backward body cannot be written so, or None where it can."""

    def merge(self, param: str, rereads: tuple[str, ...]) -> str | None:
        """Why ``param``'s loads in sibling loops (``rereads``) cannot have their adjoints written once."""

    def interchange(self, param: str, axis: int, saved: bool) -> str | None:
        """Why ``param``'s gradient cannot have a kernel of its own along ``axis``; ``saved``: where it reads the
        loops' states the forward kept (augment.py)."""


@dataclass(frozen=True)
class WritePlans:
    """The write plan of a launch (``plain``) and of one whose forward kept its loops' states (``saved``: some
    interchanges are possible only then), each strategy in them one its backward body can be written with; why an
    input's loads in sibling loops are written apart (``not_merged``) or it has no kernel of its own
    (``not_interchanged``)."""

    plain: WritePlan
    saved: WritePlan
    not_merged: dict[str, str]
    not_interchanged: dict[str, str]


def plan_writes(a: Analysis, feasible: Feasibility) -> WritePlans:
    """Per ``wrt`` input, the conditions of each strategy (static facts and launch conditions), the strategies only
    writing the backward body can rule out asked of ``feasible`` before the plans are made."""
    inputs = _shown(a)
    saved, not_merged, not_interchanged = dict(inputs), {}, {}
    for p, facts in list(inputs.items()):  # (the merge does not depend on how the other inputs are written)
        why = feasible.merge(p, facts.rereads) if facts.rereads else None
        if why is not None:  # written apart (atomically)
            not_merged[p] = why
            inputs[p] = saved[p] = InputFacts(p, why=f"it is loaded by several statements ({why})")
    for p, facts in list(inputs.items()):
        for axis in facts.interchange:
            why = feasible.interchange(p, axis, saved=False)
            if why is None:
                continue
            inputs[p] = replace(facts, interchange={}, trips=None)
            if feasible.interchange(p, axis, saved=True) is None:  # (an attention backward's: without the
                why += " (it has one where an op's forward keeps that loop's state)"  # states, every program would
            else:  # recompute the forward's loop)
                saved[p] = inputs[p]
            not_interchanged[p] = why
            break
    return WritePlans(WritePlan(inputs), WritePlan(saved), not_merged, not_interchanged)


def _shown(a: Analysis) -> dict[str, InputFacts]:
    """Per ``wrt`` input, what can be shown about its loads."""
    body = a.program.body
    used = {program_axis(s) for s in statements(body)} - {None}
    context = _Context(a, definitions(body), enclosing_loops(body), _nesting(body), loaded_values(body),
                       program_axes(body), set(AXES) if -1 in used else used, program_axes(body, through_stop=False))
    inputs = {p: context.input(p) for p in a.wrt}
    for p in a.in_place:  # its shadow holds the new values' gradient: written where loaded, no partial rows
        if inputs[p].later and p not in a.unchanged:  # (zeroed and refilled where stored: one load, one place;
            inputs[p] = InputFacts(p, why="it is loaded by several statements")  # but where no program that
        # loads stores (an early return's stores), its loads' adjoints are written as a plain input's: added to the
        # new values' gradient, or stored where there is none (BackwardKernel.prepare), the other loads' later)
        covers = inputs[p].covers if _zeroes_its_stores(a, p) else None
        inputs[p] = replace(inputs[p], covers=covers, shared={}, in_registers=frozenset(), fallback=None)
    if a.in_place:  # one kernel: every input's adjoint reads the new values' gradient before it is replaced
        inputs = {p: replace(facts, interchange={}, trips=None) for p, facts in inputs.items()}
    return inputs


def _zeroes_its_stores(a: Analysis, p: str) -> bool:
    """Whether an input updated in place keeps its loads' ``covers``: its loads read only what no store writes
    (``unchanged``: an early return's stores) and every store to it is a ``tl.store`` of a value without gradient,
    whose adjoint stores zeros and reads nothing. Where its new values have no gradient (its loads' adjoints then
    stored: BackwardKernel.prepare), the kernel writes every element and reads none: the buffer needs no zero-fill
    (and may be the input's own memory: host/donation.py)."""
    return p in a.unchanged and all(operation_of(op_of(s)).memory == "store" and not a.is_active(stored_value(s))
                                    for s in a.stores.get(p, ()))


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

    def input(self, param: str) -> InputFacts:
        a = self.a
        loads = [s for s in a.loads.get(param, []) if target_of(s) in a.active
                 and target_of(s) not in a.reloads]  # (a reload adds into the shadow: memory.py)
        if not loads:
            return InputFacts(param, inactive=True)
        if len(loads) == 1:
            return self.load(param, loads[0])
        first = self._rereads(loads)
        if first is not None:  # one address in sibling loops over one range: one write (reverse/rereads.py)
            return replace(self.load(param, first), shared={}, in_registers=frozenset(), interchange={}, trips=None,
                           rereads=tuple(target_of(s) for s in loads if s is not first))
        fallback = self._later(param, loads)
        together = self._together(param, loads)
        if together is not None:  # each written once; where a launch puts them together, the others added later
            return replace(together, fallback=fallback)
        return fallback or InputFacts(param, why="it is loaded by several statements")

    def _later(self, param: str, loads: list[ast.stmt]) -> InputFacts | None:
        """One of several loads written, the others outside loops, their adjoints added after the kernel (None: none
        can be)."""
        in_loops = [s for s in loads if any(isinstance(n, ast.For) for n in self.nested[id(s)])]
        if len(in_loops) <= 1:  # the one in a loop (else any) written once, the others added later
            for stmt in in_loops or loads:
                later = [s for s in loads if s is not stmt]
                owned = self.load(param, stmt)
                if owned.owned is not None and all(self._addable_later(s) for s in later):
                    return replace(owned, shared={}, in_registers=frozenset(), interchange={}, trips=None,
                                   later=tuple(target_of(s) for s in later))
        return None

    def _together(self, param: str, loads: list[ast.stmt]) -> InputFacts | None:
        """Several loads of an input, each reaching its addresses once, at addresses the same form shifted by
        constants (the two halves of a row: ``x + row * D + cols`` and ``x + row * D + D // 2 + cols``): each pair
        read as one load with a coordinate more, which load, whose stride is the shift (analysis/stores.py's
        ``shifted_apart``, as two stores of one output are), and shown apart over lanes, programs, iterations and
        that coordinate. Then every address is reached once by all of them together: each load's adjoint is
        stored where it is computed. Two loads of one mask, each exact, starting at the tensor's first element:
        they may cover it. None where this cannot be shown, or is shown false now."""
        a = self.a
        if any(operation_of(op_of(s)).descriptor for s in loads):
            return None
        each = [self.load(param, s) for s in loads]
        if any(f.owned is None for f in each):
            return None
        sites = [self._site(s) for s in loads]
        pairs = []
        for i, first in enumerate(sites):
            for second in sites[i + 1:]:
                try:
                    shifted = shifted_apart(first, second, a.trips, frozenset(self.loaded), self.defs, "which load")
                except NotShifted:
                    return None
                if decided_now(shifted.condition) is False:  # (they meet: the fallback)
                    return None
                pairs.append(shifted)
        written = lambda c: scalars_written_out(c, a.program.body)  # noqa: E731
        apart = written(pairs[0].condition if len(pairs) == 1 else All(tuple(p.condition for p in pairs)))
        owned = All((*(f.owned for f in each), apart))
        covers = None
        first, second = sites[0], sites[-1]
        b = arguments(loads[0])
        if (len(loads) == 2 and first.bounds == second.bounds and pairs[0].found.exact
                and mask_bounds(b["mask"], a.forms, self.defs, a.shapes, exact=True) is not None
                and not any(isinstance(n, ast.If) for s in loads for n in self.nested[id(s)])
                and not set(pairs[0].found.keys) & a.bounded_trips and self._starts_at_zero(b["pointer"].id, param)):
            found = pairs[0].found  # (a shift that is not positive at a launch: Covers fails there)
            covers = written(Covers((*found.coordinates, (pairs[0].shift, Expr.const(2))), found.bounds, param))
        return InputFacts(param, owned, covers, apart=apart, together=tuple(target_of(s) for s in loads),
                          hidden_axes=frozenset().union(*(f.hidden_axes for f in each)))

    @functools.cached_property
    def offsets(self) -> dict:
        return address_offsets(self.a.program.body, self.a.forms)

    def _site(self, stmt: ast.stmt) -> StoreSite:
        """A load read as lanes.py reads a store: its address's form and offset, tile, loops and mask's bounds."""
        a, b = self.a, arguments(stmt)
        address = b["pointer"].id
        bounds = mask_bounds(b["mask"], a.forms, self.defs, a.shapes) or []
        return StoreSite(stmt, a.forms.get(address), offset_of(address, self.offsets, a.forms), a.shapes.get(address),
                         self.around[id(stmt)], tuple(bounds))

    def _rereads(self, loads: list[ast.stmt]) -> ast.stmt | None:
        """The first of ``loads`` where each sits directly in the body of a loop of its own, the loops siblings in
        one block over one range, and each reads the first's address under its mask, the loop index aside (the
        tutorial layer norm's three passes over a row); else None. Not for an input updated in place (its shadow
        is read and zeroed between the loops) nor a descriptor's loads."""
        if self.a.in_place or any(operation_of(op_of(s)).descriptor for s in loads):
            return None
        nodes = []
        for s in loads:
            nested = self.nested[id(s)]
            if not nested or not isinstance(nested[-1], ast.For) or not any(t is s for t in nested[-1].body):
                return None
            nodes.append(nested[-1])
        if len({id(n) for n in nodes}) != len(nodes) or len({self.nested[id(n)] for n in nodes}) != 1:
            return None
        if len({ast.dump(n.iter) for n in nodes}) != 1 or not all(isinstance(n.target, ast.Name) for n in nodes):
            return None

        def text(s: ast.stmt, node: ast.For) -> tuple[str, str]:  # (each loop's index read as the first's)
            b = arguments(s)
            return tuple(canonical_atom(b[k], self.defs, {node.target.id: nodes[0].target.id})
                         for k in ("pointer", "mask"))

        if len({text(s, n) for s, n in zip(loads, nodes, strict=True)}) != 1:
            return None
        around = self.nested[id(nodes[0])]  # (the same for every one of the sibling loops)
        block = next(b for b in (child_blocks(around[-1]) if around else [self.a.program.body])
                     if any(t is nodes[0] for t in b))
        first = next(t for t in block if any(t is n for n in nodes))
        return loads[next(i for i, n in enumerate(nodes) if n is first)]

    def _addable_later(self, stmt: ast.stmt) -> bool:
        """Whether a load outside loops can keep its adjoint per program (a pointer load of rank 2 at most)."""
        shape = self.a.shapes.get(target_of(stmt))
        return shape is not None and len(shape) <= 2 and not operation_of(op_of(stmt)).descriptor

    def load(self, param: str, stmt: ast.stmt) -> InputFacts:
        """What can be shown about ``param`` loaded by ``stmt`` alone."""
        a = self.a
        b = arguments(stmt)
        descriptor = operation_of(op_of(stmt)).descriptor
        names = [o.id for o in b["offsets"].elts if isinstance(o, ast.Name)] if descriptor else [b["pointer"].id]
        mask_of = (b.get("mask"), a.forms, self.defs)
        shape = a.shapes.get(target_of(stmt) if descriptor else names[0])  # (a descriptor's: its block, no mask)
        form = descriptor_load_form(stmt, a.forms, self.defs, a.program.param_names()) if descriptor else (
            a.forms.get(names[0]))
        if descriptor and (form is None or param in a.in_place):  # (strides no launch gives)
            return InputFacts(param, why="a descriptor's load of an input updated in place, or of computed strides")
        if shape is None or (form is not None and not form.affine):
            return InputFacts(param, why="its lanes' addresses are not an affine form")
        if any(n in self.loaded for n in computed_from(names, self.defs)):
            return InputFacts(param, why="its addresses are computed from loaded data")
        terms = dict(form.terms) if form is not None else {}
        around = self.around[id(stmt)]
        terms = {k: c for k, c in terms.items() if not isinstance(k, LoopIndex) or k in around}
        if any(extent != "1" and Lane(axis) not in terms for axis, extent in enumerate(shape)):
            return InputFacts(param, why="lanes along an axis of its tile read the same element")
        bounds = descriptor_bounds(stmt, a.forms, self.defs) if descriptor else mask_bounds(*mask_of, a.shapes) or []
        found = launch_coordinates(form_of_terms(terms, len(shape)), shape, bounds, a.trips)
        if found is None:
            return InputFacts(param, why="a trip count or stride the launch cannot give")
        apart = All() if apart_whatever_launched(found.keys, _runtime_stride(terms)) else found.apart()
        present = {k.axis for k in terms if isinstance(k, ProgramId)}
        present |= {k.axis for k in terms if isinstance(k, ProgramDigit) and ProgramDigit(
            k.axis, k.divisor, not k.quotient) in terms}
        hidden = set().union(*(self.axes_of.get(n, set()) for n in names)) - present  # (not as a coordinate)
        absent = [axis for axis in AXES if axis not in present]
        single = {axis: AtMost(Expr("grid", (axis,)), 1) for axis in absent}
        written = lambda c: scalars_written_out(c, a.program.body)  # noqa: E731
        owned = None
        if all(loop in terms for loop in around):
            owned = written(All((apart, *single.values())))
        covers, fill = None, ""
        exact = (bounds if len(bounds) == len(shape) else None) if descriptor else mask_bounds(*mask_of, a.shapes, True)
        at_zero = self._starts_at_zero(descriptor_base(b["pointer"].id, self.defs) if descriptor else names[0], param)
        branched = any(isinstance(n, ast.If) for n in self.nested[id(stmt)])
        if (owned is not None and exact is not None and found.exact and at_zero
                and not set(found.keys) & a.bounded_trips  # (a grid-stride loop's count is a bound, not exact)
                and (not branched or not descriptor and self._fillable(stmt, b))):
            covers = written(Covers(found.coordinates, found.bounds, param))
            fill = target_of(stmt) if branched else ""
        lanes_only = launch_coordinates(form_of_terms({k: c for k, c in terms.items() if isinstance(k, Lane)},
                                                      len(shape)), shape, [], a.trips)
        lanes_apart = lanes_only.apart() if lanes_only is not None and (len(lanes_only.keys) > 1 or _runtime_stride(
            {k: c for k, c in terms.items() if isinstance(k, Lane)})) else All()
        shared = {axis: written(All((lanes_apart, *[single[b] for b in absent if b != axis])))
                  for axis in absent if axis not in hidden and axis in self.used}
        in_registers = frozenset(axis for axis in shared if not descriptor and self._invariant(stmt, b, axis))
        interchange, trips = {}, None
        in_one_loop = [isinstance(n, ast.For) for n in self.nested[id(stmt)]] == [True]
        # (not a grid-stride loop: its `trips` is program 0's, and another program's last iteration would be a
        # phantom, past the loop's end, storing into the element after its range)
        if in_one_loop and around[0] in terms and around[0] not in a.bounded_trips:
            trips = a.trips.get(around[0])
            if trips == Expr.const(UNKNOWN_TRIP):  # which iterations run may depend on the program (causal)
                trips = a.program_trips.get(around[0])
            varies = trips.program_axes() if trips is not None else set()
            moved = set().union(*(self.iteration_axes.get(n, set()) for n in names)) - present  # (per iteration)
            axes = [axis for axis in absent if axis in self.used and axis not in moved and varies <= {axis}]
            if trips is not None:
                interchange = {axis: written(All((apart, *[single[b] for b in absent if b != axis])))
                               for axis in axes}
        why = "" if owned is not None else "its address repeats across the iterations of a loop around it"
        if descriptor and (shared or interchange):  # (tile adds: a kernel of its own measured slower)
            owned, shared, in_registers, interchange = None, {}, frozenset(), {}
            why = "programs share its descriptor's tiles, added through the descriptor"
        return InputFacts(param, owned, covers, shared, in_registers, why, written(apart), interchange=interchange,
                          trips=trips if interchange else None, fill=fill, hidden_axes=frozenset(hidden))

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
        for name in computed_from([n.id for n in (b["pointer"], b["mask"]) if isinstance(n, ast.Name)], self.defs):
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
                operation_of(op_of(d)).on_host is operator.add and any(isinstance(x, ast.Name) and x.id == name
                                                                      for x in op_of(d).args[:2]))]
            if len(defs) != 1:
                return False
            op = op_of(defs[0])
            pointers = [x for x in op.args if isinstance(x, ast.Name) and self.a.pointer_base.get(x.id) == base]
            if operation_of(op).on_host is operator.add and len(pointers) == 1:
                other = op.args[1] if op.args[0] is pointers[0] else op.args[0]
                if not starts_at_zero(other, self.defs):
                    return False
            elif not (operation_of(op).pointer_args == (0,) and operation_of(op).on_host is not operator.sub
                      and pointers):
                return False
            name = pointers[0].id
        return False

    def _invariant(self, stmt: ast.stmt, b: dict, axis: int) -> bool:
        """Whether the load, its address and its mask can be computed once per program of a persistent
        loop along ``axis``: at the kernel's top level, from top-level values independent of the axis."""
        if self.nested[id(stmt)]:
            return False
        names = computed_from([n.id for n in (b["pointer"], b["mask"]) if isinstance(n, ast.Name)], self.defs)
        for n in names:
            for d in self.defs.get(n, []):
                if isinstance(d, ast.For) or self.nested.get(id(d)):
                    return False
            if axis in self.axes_of.get(n, set()):
                return False
        return True


def _names(results: tuple[str, ...]) -> str:
    return ", ".join(f"`{n}`" for n in results)


def _runtime_stride(terms: dict) -> bool:
    """Whether a coordinate's stride is a value the launch gives (not a literal): 0 reaches one element."""
    return any(symbols for _, symbols in terms.values())


def _nesting(body: list[ast.stmt], around: tuple = ()) -> dict[int, tuple]:
    """For each statement (structured ones included), the ``if`` and ``for`` nodes around it."""
    found = {}
    for s in body:
        found[id(s)] = around
        for block in child_blocks(s):
            found.update(_nesting(block, (*around, s)))
    return found
