"""What each value of a normalized kernel is, and which values need adjoints.

- pointers: every pointer-valued name and the parameter it is derived from
  (``x_ptr + row * stride + cols`` comes from ``x_ptr``); these get shadows.
- which pointer parameters are loaded, stored, or hold indices (their loaded values
  feed addresses), which gives the default ``wrt`` and ``outputs``;
- activity: a value is active when it depends on a ``wrt`` input (varied) and
  reaches an output (useful); only active values get adjoints;
- shapes, symbolically (``("BLOCK", "1")``), to leave out the ``unbroadcast`` of an
  operand whose shape is provably the result's;
- loops: which reversal strategy each one gets (``loops.py``).

Merge and loop-carried variables are assigned more than once (see ``ir.py``), so
``defs`` maps a name to all its definitions, and the flow facts are fixpoints.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field, replace

from ..core.errors import NotDifferentiableError
from ..core.ir import (
    Op,
    Program,
    address_names,
    arguments,
    block_positions,
    canonical_atom,
    child_blocks,
    definitions,
    is_none,
    loops,
    names_in,
    op_of,
    range_bounds,
    reads,
    refuse,
    statements,
    stored_value,
    structured,
    target_of,
    value_args,
    where,
)
from ..core.operations import LOADS, OPERATIONS, STORES, operation_of
from ..core.source import triton_language_name
from .addresses import (
    address_forms,
    address_offsets,
    descriptor_form,
    enclosing_loops,
    form_program_axes,
    mask_bounds,
    offset_of,
)
from .lanes import (
    StoreSite,
    check_data_stores,
    check_store,
    check_stores_apart,
    index_reads,
    with_scalars_written_out,
)
from .stabilizers import stabilizers

Shape = tuple[str, ...] | None  # None: unknown


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
    stabilizers: set[str] = field(default_factory=set)  # maxima whose adjoint is exactly zero (stabilizers.py)
    padding: dict[str, set[str]] = field(default_factory=dict)  # name -> MASKED, INFINITE (see `padding`)
    in_place: frozenset[str] = frozenset()  # differentiated pointers updated in place (in_place_pointers)

    def is_active(self, atom: ast.expr) -> bool:
        return isinstance(atom, ast.Name) and atom.id in self.active

    def restricted(self, wrt: tuple[str, ...]) -> Analysis:
        """The same kernel differentiated with respect to fewer inputs (a kernel of their own): activity
        and stabilizers found again, the rest shared."""
        active = _activity(self.program, self.defs, wrt, self.outputs, self.pointer_base, tile=False)
        stable = stabilizers(self.program, active)
        return replace(self, wrt=tuple(wrt), active=active - stable, stabilizers=stable,
                       in_place=self.in_place & frozenset(wrt))


@dataclass
class Pointers:
    """Which names are pointers and which parameter each comes from; what is loaded and stored through them."""

    pointer_base: dict[str, str]  # pointer-valued name -> the parameter it comes from
    loads: dict[str, list[ast.stmt]]  # pointer parameter -> its load statements
    stores: dict[str, list[ast.stmt]]  # pointer parameter -> its store / atomic statements
    index_pointers: set[str]  # pointer parameters whose loaded values are used as indices


def pointers(program: Program) -> Pointers:
    """The pointer facts of a kernel (all the tape needs to know of its launches' roles)."""
    params = program.param_names()
    body = list(statements(program.body))
    defs = definitions(program.body)

    # -- pointers -------------------------------------------------------------------------
    candidates: dict[str, set[str]] = {p: {p} for p in params}
    scalar_use: set[str] = set()  # parameters used other than additively: not pointers
    for s in body:
        op = op_of(s)
        pointer_args = _pointer_positions(s)
        for i, a in enumerate([*op.args, *op.kwargs.values()]):
            for n in names_in(a):
                if n in params and i not in pointer_args:
                    scalar_use.add(n)
    changed = True
    while changed:  # a fixpoint: loop-carried pointers feed their own definitions
        changed = False
        for s in body:
            t = target_of(s)
            if t is not None and t not in params:
                new = set().union(*[candidates.get(n, set()) for n in _pointer_operands(s)])
                if not new <= candidates.get(t, set()):
                    candidates[t] = candidates.get(t, set()) | new
                    changed = True

    pointer_base: dict[str, str] = {}
    loads: dict[str, list[ast.stmt]] = {}
    stores: dict[str, list[ast.stmt]] = {}

    def mark_chain(name: str, base: str) -> None:
        if pointer_base.get(name) == base:
            return
        pointer_base[name] = base
        for d in defs.get(name, []):
            if target_of(d) is None:
                continue
            for n in _pointer_operands(d):
                if base in candidates.get(n, set()):
                    mark_chain(n, base)

    for s in body:
        kind = op_of(s).kind
        if operation_of(op_of(s)).memory is None:
            continue
        address = arguments(s)["pointer"]
        if not isinstance(address, ast.Name):
            raise refuse(where(s), f"`{kind}` from the address `{ast.unparse(address)}`",
                         "load and store through pointer arguments")
        base = _choose_base(address.id, candidates, scalar_use, s)
        mark_chain(address.id, base)
        (loads if kind in LOADS else stores).setdefault(base, []).append(s)

    feeds_address = _feeds_addresses(body, defs, loops(program.body))
    index_pointers = {pointer_base[arguments(s)["pointer"].id] for s in body
                      if op_of(s).kind in LOADS and target_of(s) in feeds_address}
    return Pointers(pointer_base, loads, stores, index_pointers)


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
        in_place = frozenset()
    else:
        in_place = in_place_pointers(program, loads, stores, index_pointers)
        wrt, outputs = _choose_wrt_outputs(program, params, wrt, outputs, loads, stores, index_pointers, in_place)

    active = _activity(program, defs, wrt, outputs, pointer_base, tile)
    stable = stabilizers(program, active)  # a max subtracted before exp and normalized away: no adjoint
    active -= stable
    analysis = Analysis(program, wrt, outputs, pointer_base, loads, stores, index_pointers, active, defs)
    analysis.stabilizers = stable
    analysis.in_place = frozenset(in_place & set(wrt))
    analysis.shapes = infer_shapes(program, tile)
    analysis.padding = padding(program.body)
    if not tile:
        analysis.forms = address_forms(program.body, analysis.shapes, analysis.trips, frozenset(params),
                                       analysis.program_trips)
        analysis.store_axes = check_output_stores(program.body, outputs, stores, analysis.shapes, analysis.forms,
                                                  analysis.launch_checks, analysis.trips, pointer_base)
        analysis.launch_checks = [with_scalars_written_out(c, program.body) for c in analysis.launch_checks]
    return analysis


def _pointer_positions(stmt: ast.stmt) -> set[int]:
    """Argument positions through which a pointer may flow without making it a scalar use."""
    operation = operation_of(op_of(stmt))
    return {0} if operation.memory is not None else set(operation.pointer_args)


def _pointer_operands(stmt: ast.stmt) -> list[str]:
    op = op_of(stmt)
    if operation_of(op).memory is not None:
        return []
    return [n for i in _pointer_positions(stmt) if i < len(op.args) for n in names_in(op.args[i])]


def _choose_base(address: str, candidates: dict[str, set[str]], scalar_use: set[str], stmt: ast.stmt) -> str:
    options = sorted(candidates.get(address, set()) - scalar_use) or sorted(candidates.get(address, set()))
    if len(options) > 1:
        named = [p for p in options if "ptr" in p.lower()]
        if len(named) == 1:
            options = named
    if len(options) == 1:
        return options[0]
    if not options:
        raise refuse(where(stmt), f"`{op_of(stmt).kind}` through a pointer that does not come from a parameter",
                     "pointers loaded from memory or built from integers cannot be given shadows")
    raise refuse(where(stmt), f"an address built from several parameters ({', '.join(options)})",
                 "name the pointer parameter with `ptr` in it (`x_ptr`) so it can be told from offsets")


def _feeds_addresses(body: list[ast.stmt], defs: dict[str, ast.stmt], loops: list[ast.For] = ()) -> set[str]:
    """Names whose values flow into an address, a mask or a loop's range: integers, not gradients."""
    seen: set[str] = set()
    work = [n for f in loops for n in reads(f.iter)]
    for s in body:
        if operation_of(op_of(s)).memory is not None:
            work += address_names(s) + names_in(arguments(s).get("mask", ast.Constant(None)))
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        for d in defs.get(n, []):
            work += value_args(d)
    return seen


def _choose_wrt_outputs(program: Program, params: list[str], wrt, outputs, loads, stores,
                        index_pointers, in_place: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    origin = program.origin
    if outputs is None:
        outputs = tuple(p for p in params if p in stores)
    if wrt is None:
        wrt = tuple(p for p in params if p in loads and (p not in stores or p in in_place) and p not in index_pointers)
    wrt, outputs = tuple(wrt), tuple(outputs)
    for name in (*wrt, *outputs):
        if name not in params:
            raise ValueError(f"`{name}` is not a parameter of kernel `{program.name}` "
                             f"(its parameters: {', '.join(params)})")
    for name in wrt:  # (a specialization may not load what another does: its gradient is zero)
        if name not in loads and not program.specialized:
            raise ValueError(f"wrt names `{name}`, but kernel `{program.name}` never loads through it")
    for name in outputs:
        if name not in stores and not program.specialized:
            raise ValueError(f"outputs names `{name}`, but kernel `{program.name}` never stores through it")
    for name in in_place:
        if name in wrt and name not in outputs:
            raise ValueError(f"wrt names `{name}`, which kernel `{program.name}` updates in place: name it in "
                             "outputs too (the gradient of the values it held is that of the values it gets)")
    if not outputs:
        raise NotDifferentiableError(f"kernel `{program.name}`: it stores nothing", file=origin.file,
                                     line=origin.line, hint="a differentiable kernel stores its outputs")
    return wrt, outputs


def in_place_pointers(program: Program, loads: dict, stores: dict, index_pointers: set) -> frozenset[str]:
    """The pointer parameters a kernel updates in place (loads and stores through them), each checked.

    Accepted: each load of the pointer is followed, in the same block, by a ``tl.store`` to the same
    address under the same mask. The stores write distinct elements (checked as for any output: lanes,
    programs, iterations, and several stores apart), so every element a lane reads is written by that
    later store alone, and read by no other lane: the loads see the values the kernel was given, the
    stores set new ones. The derived kernel reads the new values' gradient at each store and sets it to
    zero there, and the loads' adjoints add the old values' gradient to the same memory (memory.py).
    """
    found = set()
    place = block_positions(program.body)
    defs = definitions(program.body)
    for name in sorted(set(loads) & set(stores)):
        for s in loads[name]:
            if name in index_pointers:
                raise refuse(where(s), f"a load of indices from `{name}`, which the kernel also stores to",
                             "read indices and write results through different pointers")
            kinds = {op_of(t).kind for t in stores[name]}
            if kinds != {"store"}:
                raise refuse(where(s), f"a load from `{name}`, which the kernel also updates with "
                             f"{', '.join(sorted(kinds - {'store'}))}", "update a tensor in place with tl.store only")
            block, i = place[id(s)]
            address, mask = canonical_atom(arguments(s)["pointer"], defs), canonical_atom(arguments(s)["mask"], defs)
            later = [t for t in stores[name] if place[id(t)][0] is block and place[id(t)][1] > i]
            if not any((canonical_atom(arguments(t)["pointer"], defs), canonical_atom(arguments(t)["mask"], defs))
                       == (address, mask) for t in later):
                raise refuse(where(s), f"a load from `{name}`, which the kernel also stores to, where no store "
                             "of the same address and mask follows it in the same block",
                             "update in place only what each lane loads (load, compute, then store to the same "
                             "address with the same mask), read back only what the same lane stored before (the "
                             "same address and mask, in the same block), or write to another tensor")
        found.add(name)
    return frozenset(found)


def check_output_stores(body: list[ast.stmt], outputs, stores, shapes, forms, launch_checks, trips, pointer_base
                        ) -> dict[str, set[int]]:
    """Refuse stores whose adjoint would be wrong; return the program axes each output's addresses use.

    A store's adjoint hands the output's gradient to the stored value. That is right only
    when no other store overwrites the element: so each store's lanes write distinct elements,
    several stores to one output (unless in exclusive branches of an ``if``) write disjoint
    addresses, and stores at addresses computed from loaded indices (a scatter) have programs
    whose ranges are apart on the indices each launch passes (lanes.py). Stores repeating an
    address across loop iterations are refused in loops.py. Whether programs overwrite each
    other's elements depends on the grid, checked at launch (derive.py).
    """
    loaded = loaded_values(body)
    axes_of = program_axes(body)
    paths = _branch_paths(body)
    around = enclosing_loops(body)
    defs = definitions(body)
    offsets = address_offsets(body, forms)
    reads = None  # scalars loaded from index tensors (lanes.index_reads), where a scatter needs them
    store_axes = {}
    for output in outputs:
        plain = [s for s in stores.get(output, []) if op_of(s).kind in ("store", "desc_store")]
        if plain and len(plain) < len(stores[output]):
            raise refuse(where(plain[0]), f"`{output}` both stored and accumulated atomically",
                         "write each output either with tl.store or with tl.atomic_add")
        sites, data = {}, []
        kept: dict[int, set[int]] = {}  # store -> the program axes its address keeps as coordinates
        for s in plain:
            if any(n in loaded for n in address_names(s)):  # a scatter: checked on the loaded indices
                form = forms.get(arguments(s)["pointer"].id)
                if op_of(s).kind != "store" or (form is not None and not form.affine):
                    raise refuse(where(s), f"a tl.store to `{output}` at addresses computed from loaded data",
                                 "a scatter may write one element twice; use tl.atomic_add to accumulate instead")
                address = arguments(s)["pointer"].id
                bounds = mask_bounds(arguments(s)["mask"], forms, defs, shapes, loaded=True)
                data.append(StoreSite(s, forms.get(address), offset_of(address, offsets, forms), shapes.get(address),
                                      around[id(s)], tuple(bounds)))
            if op_of(s).kind == "store":
                address = arguments(s)["pointer"].id
                bounds = mask_bounds(arguments(s)["mask"], forms, defs, shapes)
                sites[id(s)] = StoreSite(s, forms.get(address), offset_of(address, offsets, forms), shapes.get(address),
                                         around[id(s)], tuple(bounds))
                launch_checks += check_store(s, forms.get(address), output, shapes.get(address), around[id(s)],
                                             bounds, trips)
                kept[id(s)] = form_program_axes(forms.get(address))
            else:  # a descriptor's block: its lanes are apart, its offsets may not be
                form = descriptor_form(arguments(s)["offsets"].elts, forms)
                launch_checks += check_store(s, form, output, shapes.get(arguments(s)["pointer"].id), around[id(s)],
                                             trips=trips)
                kept[id(s)] = form_program_axes(form)
        for i, second in enumerate(plain):  # stores that may both run: at disjoint addresses
            for first in plain[:i]:
                if _exclusive(paths[id(first)], paths[id(second)]):
                    continue
                if id(first) not in sites or id(second) not in sites:
                    raise refuse(where(second), f"a second tl.store to `{output}`",
                                 "store each output once: compute the final value first, or store different outputs")
                launch_checks += check_stores_apart(sites[id(first)], sites[id(second)], output, trips,
                                                    frozenset(loaded), defs)
        if data:
            if reads is None:
                reads = index_reads(body, forms, offsets, shapes, pointer_base, loaded)
            (check,) = check_data_stores(data, output, reads, loaded, trips)
            launch_checks.append(check)
            for site in data:  # programs along its axis are checked apart on the indices
                kept[id(site.stmt)].add(check.condition.axis)
        for s in plain:
            _refuse_lost_program_ids(s, output, set().union(*[axes_of.get(n, set()) for n in address_names(s)]),
                                     kept[id(s)])
        if plain:  # tl.atomic_add outputs accumulate: programs may share elements
            store_axes[output] = set().union(*[axes_of.get(n, set()) for s in plain for n in address_names(s)])
    return store_axes


def _refuse_lost_program_ids(stmt: ast.stmt, output: str, used: set[int], kept: set[int]) -> None:
    """A store address computed from a program id by an operation that loses its coordinate (``tl.minimum(pid,
    n)``, ``tl.where``, a loop whose range depends on it other than by moving both bounds alike) may send two
    programs to one element: the checks see no program coordinate there to keep them apart."""
    lost = sorted(used - kept)
    if lost:
        raise refuse(where(stmt), f"a tl.store to `{output}` whose address uses tl.program_id({lost[0]}) through an "
                     "operation that may send two programs to one element",
                     "build addresses from program ids with + and *, or with both `pid // n` and `pid % n`")


def _branch_paths(body: list[ast.stmt], path: tuple = ()) -> dict[int, tuple]:
    """For each flat statement, the (if node, branch) pairs it sits under."""
    paths = {}
    for stmt in body:
        if isinstance(stmt, ast.If):
            for branch, block in enumerate(child_blocks(stmt)):
                paths.update(_branch_paths(block, (*path, (id(stmt), branch))))
        elif isinstance(stmt, ast.For):
            paths.update(_branch_paths(stmt.body, path))
        else:
            paths[id(stmt)] = path
    return paths


def _exclusive(a: tuple, b: tuple) -> bool:
    """Whether two statements sit in different branches of one ``if``: never both run."""
    branch_of = dict(a)
    return any(node in branch_of and branch_of[node] != branch for node, branch in b)


def _fixpoint(body: list[ast.stmt], step) -> dict[str, set]:
    """Facts per name: ``step(sources, stmt, facts)`` for each definition until nothing changes.

    A definition is a flat statement (its sources: the names its operation reads) or a
    loop (its target's sources: the names its range reads). Several passes, because
    loop-carried names feed their own definitions.
    """
    definitions = [(target_of(s), value_args(s), s) for s in statements(body) if target_of(s)]
    definitions += [(f.target.id, sorted(reads(f.iter)), f) for f in structured(body) if isinstance(f, ast.For)]
    facts: dict[str, set] = {}
    changed = True
    while changed:
        changed = False
        for target, sources, stmt in definitions:
            new = step(sources, stmt, facts) | facts.get(target, set())
            if new != facts.get(target, set()):
                facts[target], changed = new, True
    return facts


MASKED, INFINITE = "masked", "infinite"


def padding_at_unbounded(stmt: ast.stmt, padding: dict[str, set[str]]) -> set[str]:
    """The padding facts of the operand at which the statement's operation is unbounded (``b`` of ``a / b``)."""
    param = operation_of(op_of(stmt)).unbounded_in
    operand = arguments(stmt).get(param) if param else None
    return set().union(*(padding.get(n, set()) for n in names_in(operand))) if operand is not None else set()


def padding(body: list[ast.stmt]) -> dict[str, set[str]]:
    """What the lanes a load's mask left out may hold, per name computed lane by lane from them: MASKED
    (the load's ``other``, and what follows from it), INFINITE (±inf or NaN there: an ``other`` of
    ``-float("inf")``, or a log, a division... of a masked-off value). The reverse sweep keeps a zero
    adjoint times such a value zero there (``0 * inf``), as the unpadded function's gradient is."""
    literals: dict[str, ast.expr] = {}  # `neg_x = -float("inf")`: names the frontend gave literal values
    for stmt in statements(body):
        value = getattr(stmt, "value", None)
        if target_of(stmt) and op_of(stmt).kind in ("neg", "pos", "copy"):
            literals[target_of(stmt)] = value

    def finite(expr: ast.expr) -> bool:
        """A literal is read (``-float("inf")`` is not finite); other names hold values the kernel computed
        or was passed, finite as far as the derivation can tell."""
        if isinstance(expr, ast.Name):
            return expr.id not in literals or finite(literals[expr.id])
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
            return finite(expr.operand)
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "float"
                and len(expr.args) == 1 and isinstance(expr.args[0], ast.Constant)):
            return math.isfinite(float(expr.args[0].value))
        return not isinstance(expr, ast.Constant) or not isinstance(expr.value, float) or math.isfinite(expr.value)

    def step(sources, stmt, facts):
        if isinstance(stmt, ast.For):
            return set()
        op = op_of(stmt)
        if op.kind in LOADS:
            other = _load_other(stmt)
            return set() if is_none(other) else {MASKED} if finite(other) else {MASKED, INFINITE}
        operation = operation_of(op)
        if not (operation.elementwise or operation.lanes == "same"):
            return set()
        inherited = set().union(*(facts.get(n, set()) for n in sources))
        if operation.finite_at_minus_inf:  # the -inf padding of a max or a softmax (+inf is NaN forward already)
            inherited -= {INFINITE}
        return inherited | {INFINITE} if MASKED in padding_at_unbounded(stmt, facts) else inherited

    return {n: v for n, v in _fixpoint(body, step).items() if v}


def loaded_values(body: list[ast.stmt]) -> set[str]:
    """The names computed from loaded data."""
    return downstream(body, {target_of(s) for s in statements(body) if op_of(s).kind in LOADS})


def downstream(body: list[ast.stmt], roots: set[str]) -> set[str]:
    """``roots`` and every name computed from them."""
    def step(sources, stmt, facts):
        return {True} if target_of(stmt) in roots or any(facts.get(n) for n in sources) else set()

    return {n for n, v in _fixpoint(body, step).items() if v}


def program_axes(body: list[ast.stmt], through_stop: bool = True) -> dict[str, set[int]]:
    """For each name, the program-id axes its value depends on (a loop's index: those its range does; without
    ``through_stop``, those its start and step do: which iterations run aside, what each computes)."""
    def step(sources, stmt, facts):
        if isinstance(stmt, ast.For):
            if not through_stop:
                start, _, stride = range_bounds(stmt)
                sources = reads(start) | reads(stride)
            return set().union(*[facts.get(n, set()) for n in sources])
        if op_of(stmt).kind == "program_id":
            axis = program_axis(op_of(stmt))
            return {axis} if axis is not None else {0, 1, 2}
        return set().union(*[facts.get(n, set()) for n in sources])

    return _fixpoint(body, step)


def program_axis(op: Op) -> int | None:
    """The axis of a ``tl.program_id(axis)`` (None: not a literal)."""
    axis = op.args[0] if op.args else op.kwargs.get("axis")
    return axis.value if isinstance(axis, ast.Constant) and isinstance(axis.value, int) else None


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
                        and not any(n in varied for n in names_in(_load_other(s)))):
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
                    raise refuse(where(s), "`**` with an exponent that depends on the inputs",
                                 "use tl.exp(b * tl.log(a)) for a variable exponent")
            if operation.has_rule:  # parameters without an adjoint (axis, condition, dtype) are discrete
                work += [n for param, arg in arguments(s).items() if param in operation.adjoints
                         for n in names_in(arg)]
            elif op.kind in LOADS:
                work += names_in(_load_other(s))
    return varied & useful


def _load_other(stmt: ast.stmt) -> ast.expr:
    """A masked load's ``other`` (the value of the lanes its mask leaves out); None for other loads."""
    b = arguments(stmt)
    if is_none(b.get("mask", ast.Constant(None))):
        return ast.Constant(None)
    return b.get("other", ast.Constant(None))


def _no_rule(stmt: ast.stmt) -> NotDifferentiableError:
    op = op_of(stmt)
    what = {"mod": "`%` on differentiated values", "call": f"a call to `{getattr(op.func, '__name__', '?')}`",
            "custom": "a custom rule",
            "reduce": f"`tl.reduce` combining with `{_combine_name(op)}`, which is not a sum, max or min",
            "associative_scan": f"`tl.associative_scan` combining with `{_combine_name(op)}`, which is not a sum "
                                "of one tensor nor a first-order linear recurrence of a pair",
            # compiled Triton requires can_reorder=True: which input an element came from is not defined
            "cat": "`cat`, whose element order Triton leaves unspecified (can_reorder=True)",
            }.get(op.kind, f"`{op.kind}`")
    hint = "write the operation with Triton functions tritongrad knows, or give a helper a rule with tg.custom_vjp"
    if op.kind == "associative_scan":
        hint = ("scan a pair (a, b) combined as (a1, b1), (a2, b2) -> (a1 * a2, b1 * a2 + b2), or write the "
                "scan as a loop")
    if op.kind == "cat":
        hint = "concatenate with tl.join (then tl.permute / tl.reshape), whose element order is defined"
    if operation_of(op).memory is not None:
        hint = "the result of an atomic operation cannot be differentiated"
    return refuse(where(stmt), f"{what} (no derivative rule)", hint)


def _combine_name(op: Op) -> str:
    fn = op.args[2] if len(op.args) > 2 else op.kwargs.get("combine_fn")
    return ast.unparse(fn) if fn is not None else "?"


INT_DTYPES = ("tl.int", "tl.uint")


def _is_int_cast(stmt: ast.stmt, program: Program) -> bool:
    op = op_of(stmt)
    if op.kind not in ("to", "cast"):
        return False
    dtype = arguments(stmt)["dtype"]
    return ast.unparse(dtype).startswith(INT_DTYPES) or ast.unparse(dtype) == "tl.int1"


# -- shapes ---------------------------------------------------------------------------------

def infer_shapes(program: Program, tile: bool = False) -> dict[str, Shape]:
    # a kernel's parameters are scalars and pointers; a tile function's are tiles of unknown shape
    shapes: dict[str, Shape] = {p: None if tile else () for p in program.param_names()}

    def of(atom: ast.expr) -> Shape:
        if isinstance(atom, ast.Name):
            return shapes.get(atom.id)
        if isinstance(atom, ast.Constant) or (isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name)
                                              and atom.func.id == "float"):  # -float("inf")
            return ()
        if isinstance(atom, ast.UnaryOp):
            return of(atom.operand)
        return None

    # Triton keeps a loop-carried variable's type, and a runtime if's outputs have one type: their first
    # known shape holds. A constexpr if's branches may differ: their definitions must agree.
    fixed: set[str] = set()
    for node in structured(program.body):
        if isinstance(node, ast.For):
            shapes[node.target.id] = ()
            fixed |= {c.name for c in node.tg.carried}
        elif not node.tg.static:
            fixed |= set(node.tg.merges)
    for s in statements(program.body):
        t = target_of(s)
        if t is None:
            continue
        try:
            shape = _shape_of(s, of)
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, NotDifferentiableError):
            shape = None  # shapes only let codegen leave out an unbroadcast: unknown is always safe
        if t not in shapes or (t in fixed and shapes[t] is None):
            shapes[t] = shape
        elif t not in fixed and shapes[t] != shape:
            shapes[t] = None
    return shapes


def _dims(atom: ast.expr) -> Shape:
    if isinstance(atom, (ast.Tuple, ast.List)):
        if len(atom.elts) == 1 and isinstance(atom.elts[0], (ast.Tuple, ast.List)):
            return _dims(atom.elts[0])
        return tuple(ast.unparse(e) for e in atom.elts)
    return None


def broadcast(*shapes: Shape) -> Shape:
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {"1"}
        out.append(sorted(dims)[0] if dims else "1")
    return tuple(out)


def _shape_of(stmt: ast.stmt, of) -> Shape:
    op = op_of(stmt)
    kind = op.kind
    b = arguments(stmt)
    if kind in ("program_id", "num_programs", "cdiv"):
        return ()
    if kind == "arange":
        start, end = op.args[0], op.args[1]
        if isinstance(start, ast.Constant) and start.value == 0:
            return (ast.unparse(end),)
        return (f"{ast.unparse(end)} - {ast.unparse(start)}",)
    if kind in ("zeros", "full"):
        return _dims(op.args[0] if op.args else op.kwargs.get("shape"))
    if kind in LOADS:
        return of(b["pointer"])
    if kind == "make_tensor_descriptor":
        return _dims(b["block_shape"])
    if kind == "subscript":
        x = of(b["input"])
        index = op.kwargs["index"]
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        if x is None:
            return None
        out, i = [], 0
        for p in parts:
            if isinstance(p, ast.Constant):
                out.append("1")
            else:
                out.append(x[i])
                i += 1
        return tuple(out) + x[i:]
    if kind == "expand_dims":
        x, axis = of(b["input"]), ast.literal_eval(b["axis"])
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        out = list(x)
        for a in axes:
            out.insert(a if a >= 0 else len(out) + 1 + a, "1")
        return tuple(out)
    if kind in ("reshape", "view", "broadcast_to"):
        return _dims(b["shape"])
    if kind in ("trans", "permute"):
        x = of(b["input"])
        dims = b["dims"].elts if isinstance(b["dims"], ast.Tuple) else []
        if len(dims) == 1 and isinstance(dims[0], (ast.Tuple, ast.List)):
            dims = dims[0].elts
        order = [ast.literal_eval(d) for d in dims] or list(reversed(range(len(x))))
        return tuple(x[i] for i in order)
    if kind in ("sum", "max", "min", "argmax", "argmin"):
        x, axis = of(op.args[0]), ast.literal_eval(b.get("axis", ast.Constant(None)))
        keep = ast.literal_eval(b.get("keep_dims", ast.Constant(False)))
        if axis is None:  # tl.reduce flattens first; tl.sum and friends keep the rank
            flattened = triton_language_name(op.func, None) == "reduce"
            return (("1",) if flattened else tuple("1" for _ in x)) if keep else ()
        axis = axis % len(x)
        return tuple("1" if i == axis else d for i, d in enumerate(x)) if keep else x[:axis] + x[axis + 1:]
    if kind == "dot":
        x, y = of(b["input"]), of(b["other"])
        return x[:-1] + y[-1:]
    if kind in ("to", "cast", "cumsum", "cumprod"):
        return of(b["input"])
    if kind == "softmax":
        return of(b["x"])
    if kind in ("copy", "neg", "pos", "not_", "invert") or (
            kind in OPERATIONS and OPERATIONS[kind].elementwise):  # not a custom rule's: its helper may reduce
        return broadcast(*[of(a) for a in op.args if not isinstance(a, (ast.Tuple, ast.List))])
    return None
