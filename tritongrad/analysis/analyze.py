"""What each value of a normalized kernel is, and which values need adjoints.

- pointers: every pointer-valued name and the parameter it is derived from
  (``x_ptr + row * stride + cols`` comes from ``x_ptr``); these get shadows.
- which pointer parameters are loaded, stored, or hold indices (their loaded values
  feed addresses), which gives the default ``wrt`` and ``outputs``;
- activity: a value is active when it depends on a ``wrt`` input (varied) and
  reaches an output (useful); only active values get adjoints;
- shapes, symbolically (``("BLOCK", "1")``), to leave out the ``unbroadcast`` of an
  operand whose shape is provably the result's;
- loops: which reversal strategy each one gets (reverse/loop_plans.py).

Merge and loop-carried variables are assigned more than once (see ``ir.py``), so
``defs`` maps a name to all its definitions, and the flow facts are fixpoints.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

from ..core.errors import NotDifferentiableError
from ..core.ir import (
    Op,
    Program,
    arguments,
    construct_origin,
    definitions,
    names_in,
    op_of,
    refuse,
    statements,
    stored_value,
    target_of,
    value_args,
)
from ..core.operations import LOADS, STORES, operation_of
from .addresses import (
    address_forms,
)
from .flow import load_other, padding
from .in_place import InPlace, in_place_pointers
from .lanes import (
    with_scalars_written_out,
)
from .pointers import Pointers, pointers
from .shapes import Shape, infer_shapes
from .stabilizers import stabilizers
from .stores import check_output_stores


@dataclass
class Analysis:
    program: Program
    wrt: tuple[str, ...]
    outputs: tuple[str, ...]
    pointer_base: dict[str, str]  # pointer-valued name -> the parameter it comes from
    loads: dict[str, list[ast.stmt]]  # pointer parameter -> its load statements
    stores: dict[str, list[ast.stmt]]  # pointer parameter -> its store / atomic statements
    index_pointers: set[str]  # pointer parameters whose loaded values are used as indices
    active: set[str]  # names that need an adjoint
    defs: dict[str, list[ast.stmt]] = field(default_factory=dict)  # name -> its definitions
    shapes: dict[str, Shape] = field(default_factory=dict)
    store_axes: dict[str, set[int]] = field(default_factory=dict)  # output -> program axes its addresses use
    forms: dict[str, object] = field(default_factory=dict)  # address name -> addresses.Form (kernels only)
    launch_checks: list = field(default_factory=list)  # checks.LaunchCheck: conditions on a launch's arguments
    trips: dict = field(default_factory=dict)  # loop coordinate -> its trip count (addresses.address_forms)
    program_trips: dict = field(default_factory=dict)  # loop coordinate -> its count where program ids decide it
    bounded_trips: set = field(default_factory=set)  # loop coordinates whose `trips` bounds each program's count
    stabilizers: set[str] = field(default_factory=set)  # maxima whose adjoint is exactly zero (stabilizers.py)
    padding: dict[str, set[str]] = field(default_factory=dict)  # name -> MASKED, INFINITE (see `padding`)
    in_place: frozenset[str] = frozenset()  # differentiated pointers updated in place (in_place_pointers)
    reloads: dict[str, str] = field(default_factory=dict)  # a load reading back what the kernel stored -> its pointer
    as_left_params: dict[str, str] = field(default_factory=dict)  # reloaded pointer -> its values after the launch
    updates: dict[int, tuple[str, ...]] = field(default_factory=dict)  # id(a store over an input updated in place)
    # -> the results of the loads whose elements it overwrites (in_place.py)
    unchanged: frozenset[str] = frozenset()  # of in_place, those whose loads read only elements no store of the
    # launch writes (in_place.py: an early return's stores): their loads' adjoints add to the new values' gradient

    def is_active(self, atom: ast.expr) -> bool:
        return isinstance(atom, ast.Name) and atom.id in self.active

    def with_maxima(self, maxima: set[int]) -> Analysis:
        """The same kernel with the running maxima online.py's ``online_maxima`` found (statement tags, by id) taken
        as stabilizers: a name each of whose definitions is one of them, or a start outside every loop computed from
        nothing active, and the values computed from such names alone, carry no derivative (forward mode)."""
        body = list(statements(self.program.body))
        in_loops = {id(s) for top in self.program.body for node in ast.walk(top) if isinstance(node, ast.For)
                    for s in statements(node.body)}
        cut = {n for n in self.active if all(
            id(d.tg) in maxima or (id(d) not in in_loops and not any(a in self.active for a in value_args(d)))
            for d in self.defs.get(n, [])) and any(id(d.tg) in maxima for d in self.defs.get(n, []))}
        if not cut:
            return self
        active = set(self.active) - cut
        stored = {a for s in body if target_of(s) is None for a in value_args(s)}
        readers: dict[str, set[str]] = {}
        for s in body:
            for a in value_args(s):
                readers.setdefault(a, set()).add(target_of(s))
        changed = True
        while changed:  # (fixpoints: what only the maxima determine, the rescaling factors; what only they read,
            changed = False  # the row max each update takes)
            for s in body:
                t = target_of(s)
                if t in active and op_of(s).kind not in LOADS and not any(
                        a in active for d in self.defs.get(t, []) for a in value_args(d)):
                    active.discard(t)
                    changed = True
            for n in list(active):
                if n not in stored and not readers.get(n, set()) & active:
                    active.discard(n)
                    changed = True
        return replace(self, active=active, stabilizers=self.stabilizers | cut)

    def restricted(self, wrt: tuple[str, ...]) -> Analysis:
        """The same kernel differentiated with respect to fewer inputs (a kernel of their own): activity
        and stabilizers found again, the rest shared."""
        active = _activity(self.program, self.defs, wrt, self.outputs, self.pointer_base, tile=False)
        stable = stabilizers(self.program, active)
        return replace(self, wrt=tuple(wrt), active=active - stable, stabilizers=stable,
                       in_place=self.in_place & frozenset(wrt), unchanged=self.unchanged & frozenset(wrt))


def analyze(program: Program, wrt: tuple[str, ...] | None, outputs: tuple[str, ...] | None,
            tile: bool = False) -> Analysis:
    params = program.param_names()
    defs = definitions(program.body)
    found = pointers(program)
    pointer_base, loads, stores, index_pointers = found.pointer_base, found.loads, found.stores, found.index_pointers

    # -- what to differentiate ------------------------------------------------------------
    if tile:
        wrt = tuple(wrt if wrt is not None else params)
        outputs = ()
        place = InPlace()
    else:
        place = in_place_pointers(program, found)
        wrt, outputs = _choose_wrt_outputs(program, params, wrt, outputs, found, place)
    in_place = place.pointers

    active = _activity(program, defs, wrt, outputs, pointer_base, tile)
    stable = stabilizers(program, active)  # a max subtracted before exp and normalized away: no adjoint
    active -= stable
    analysis = Analysis(program, wrt, outputs, pointer_base, loads, stores, index_pointers, active, defs)
    analysis.stabilizers = stable
    analysis.in_place = frozenset((in_place | _overwritten(found, wrt, outputs)) & set(wrt))
    analysis.reloads, analysis.as_left_params, analysis.updates = place.reloads, place.as_left, place.updates
    analysis.unchanged = place.unchanged & analysis.in_place
    analysis.shapes = infer_shapes(program, tile)
    analysis.padding = padding(program.body)
    if not tile:
        analysis.forms = address_forms(program.body, analysis.shapes, analysis.trips, frozenset(params),
                                       analysis.program_trips, analysis.bounded_trips)
        # a tensor updated in place is checked as an output is, differentiated or not: the backward recomputes the
        # values it held before the launch, which each lane read only if no other lane or program stored there first
        checked = (*outputs, *sorted(in_place - set(outputs)))
        analysis.store_axes = check_output_stores(program.body, checked, stores, analysis.shapes, analysis.forms,
                                                  analysis.launch_checks, analysis.trips, pointer_base,
                                                  frozenset(params), frozenset(analysis.bounded_trips))
        analysis.launch_checks = [with_scalars_written_out(c, program.body) for c in analysis.launch_checks]
    return analysis


def _overwritten(found: Pointers, wrt: tuple[str, ...], outputs: tuple[str, ...]) -> frozenset[str]:
    """Pointers named in both ``wrt`` and ``outputs`` (the launch updates them in place: an op names so those it
    does in any specialization, host/kernel_roles.py) that this kernel overwrites with ``tl.store`` only, loaded or
    not: a specialization that stores without loading (a constexpr turning the update into a plain store) replaces
    the values too, so the shadow is zeroed where it stores, as an update's (reverse/memory.py), and the old values
    there get no gradient from the new ones. Without a specialization these are ``Pointers.in_place`` already."""
    return frozenset(p for p in set(wrt) & set(outputs) if p in found.stores and p not in found.index_pointers
                     and all(operation_of(op_of(s)).access == "store" for s in found.stores[p]))


def _choose_wrt_outputs(program: Program, params: list[str], wrt, outputs, found: Pointers, place: InPlace
                        ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    origin, loads, stores, in_place = program.origin, found.loads, found.stores, found.in_place
    if outputs is None:
        outputs = tuple(p for p in params if p in stores)
    if wrt is None:
        wrt = tuple(p for p in params if p in found.default_wrt)
    wrt, outputs = tuple(wrt), tuple(outputs)
    for name in (*wrt, *outputs):
        if name not in params:
            raise ValueError(f"`{name}` is not a parameter of kernel `{program.name}` "
                             f"(its parameters: {', '.join(params)})")
    pointers = [p for p in params if p in set(found.pointer_base.values())]
    for what, names, used, verb in (("wrt", wrt, loads, "loads"), ("outputs", outputs, stores, "stores")):
        for name in names:  # (a specialization may not load what another does: its gradient is zero)
            if name in used or program.specialized:
                continue
            if name not in pointers:
                raise ValueError(f"{what} names `{name}`, which kernel `{program.name}` does not use as a pointer "
                                 f"(its pointer parameters: {', '.join(pointers)})")
            raise ValueError(f"{what} names `{name}`, but kernel `{program.name}` never {verb} through it")
    for name in in_place:
        if name in wrt and name not in outputs:
            raise ValueError(f"wrt names `{name}`, which kernel `{program.name}` updates in place: name it in "
                             "outputs too (the gradient of the values it held is that of the values it gets)")
    for load, name in place.reloads.items():  # (its gradient reaches the store's value through the shadow)
        if name not in wrt or name not in outputs:
            line = next(construct_origin(s).line for s in found.loads[name] if target_of(s) == load)
            raise ValueError(f"kernel `{program.name}` reads back on line {line} what it stored over `{name}`: name "
                             f"`{name}` in both wrt and outputs (the gradient of what it reads back flows through "
                             f"`{name}`'s shadow to the value stored there)")
    if not outputs:
        raise NotDifferentiableError(f"kernel `{program.name}`: it stores nothing", file=origin.file,
                                     line=origin.line, hint="a differentiable kernel stores its outputs")
    return wrt, outputs


def _activity(program: Program, defs, wrt, outputs, pointer_base, tile: bool) -> set[str]:
    body = list(statements(program.body))
    varied: set[str] = set(wrt) if tile else set()
    changed = True
    while changed:  # a fixpoint: loop-carried values feed their own definitions
        changed = False
        for s in body:
            t = target_of(s)
            if t is None or t in pointer_base or t in varied:
                continue
            op = op_of(s)
            if op.kind in LOADS:  # varied through memory, or through `other` (the lanes its mask leaves out)
                if (pointer_base[arguments(s)["pointer"].id] not in wrt
                        and not any(n in varied for n in names_in(load_other(s)))):
                    continue
            elif operation_of(op).no_gradient or _is_int_cast(s, program):
                continue
            elif not any(n in varied for n in value_args(s)):
                continue
            varied.add(t)
            changed = True

    useful: set[str] = set()
    work: list[str] = []
    if tile:
        work += [n for r in program.returns for n in names_in(r)]
    for s in body:
        kind = op_of(s).kind
        if kind in STORES and pointer_base[arguments(s)["pointer"].id] in outputs:
            work += names_in(stored_value(s))
    while work:
        n = work.pop()
        if n in useful or n not in varied:
            continue
        useful.add(n)
        for s in defs.get(n, []):
            op = op_of(s)
            operation = operation_of(op)
            if target_of(s) is None or operation.no_gradient:  # `acc = tl.zeros(...)` before a loop
                continue
            if not operation.has_rule and op.kind not in LOADS:
                raise _no_rule(s)
            if op.kind == "pow":
                b = arguments(s)["b"]
                if names_in(b) and any(x in varied for x in names_in(b)):
                    raise refuse(construct_origin(s), "`**` with an exponent that depends on the inputs",
                                 "use tl.exp(b * tl.log(a)) for a variable exponent")
            if operation.has_rule:  # parameters without an adjoint (axis, condition, dtype) are discrete
                work += [n for param, arg in arguments(s).items() if param in operation.adjoints
                         for n in names_in(arg)]
            elif op.kind in LOADS:
                work += names_in(load_other(s))
    return varied & useful


def _no_rule(stmt: ast.stmt) -> NotDifferentiableError:
    op = op_of(stmt)
    what = {"mod": "`%` on differentiated values", "call": f"a call to `{getattr(op.func, '__name__', '?')}`",
            "custom": "a custom rule",
            "reduce": f"`tl.reduce` combining with `{_combine_name(op)}`, which is not a sum, max or min",
            "associative_scan": f"`tl.associative_scan` combining with `{_combine_name(op)}`, which is not a sum "
                                "of one tensor nor a first-order linear recurrence of a pair",
            # compiled Triton requires can_reorder=True: which input an element came from is not defined
            "cat": "`cat`, whose element order Triton leaves unspecified (can_reorder=True)",
            # Triton's interpreter gives one of the operands, compiled Triton a boolean
            "boolop": "`and` / `or` of differentiated values",
            "ifexp": "a conditional expression inside a test, on differentiated values",
            }.get(op.kind, f"`{op.kind}`")
    hint = _HINTS.get(op.kind, "write the operation with Triton functions tritongrad knows, or give a helper a rule "
                               "with tg.custom_vjp")
    if operation_of(op).memory is not None:
        hint = "the result of an atomic operation cannot be differentiated"
    return refuse(construct_origin(stmt), f"{what} (no derivative rule)", hint)


_CHOOSE = "choose a value with tl.where or an `if` statement; combine conditions with & and |"
_HINTS = {"associative_scan": "scan a pair (a, b) combined as (a1, b1), (a2, b2) -> (a1 * a2, b1 * a2 + b2), or "
                              "write the scan as a loop",
          "boolop": _CHOOSE, "ifexp": _CHOOSE,
          "cat": "concatenate with tl.join (then tl.permute / tl.reshape), whose element order is defined"}


def _combine_name(op: Op) -> str:
    fn = op.args[2] if len(op.args) > 2 else op.kwargs.get("combine_fn")
    return ast.unparse(fn) if fn is not None else "?"


INT_DTYPES = ("tl.int", "tl.uint")


def _is_int_cast(stmt: ast.stmt, program: Program) -> bool:
    op = op_of(stmt)
    if not operation_of(op).converts:
        return False
    dtype = arguments(stmt)["dtype"]
    return ast.unparse(dtype).startswith(INT_DTYPES) or ast.unparse(dtype) == "tl.int1"


# -- shapes ---------------------------------------------------------------------------------


