"""Which reversal strategy each ``for`` loop gets, and why.

The reverse loop runs the forward's iteration space in the forward's order,
recomputing each iteration's values (and its index and pointer state) before that
iteration's adjoints. That is exact when no adjoint has to travel from one iteration
to the one before it, which holds when every loop-carried variable is either

- *recomputed*: it carries no gradient (indices, pointers, inactive values), so the
  reverse loop re-runs its updates exactly as the forward did; or
- *a linear accumulator*: its next value is itself plus (or ``tl.dot(a, b, acc)``
  onto) something that does not read any carried variable with a gradient, and it is
  used for nothing else inside the loop. Then ``d(next) / d(acc)`` is the identity, so
  its adjoint is the same in every iteration: the adjoint of its value after the loop.

A carried variable with a gradient used any other way (a running max, ``h = h * a + b``)
is *nonlinear*: its adjoint changes from one iteration to the one before, so the
reverse loop must run the iterations backwards, and it needs the variable's value at
the start of each. A *state tape* keeps it: a pass over the iterations first writes the
carried state at the start of each to global scratch memory (the backward kernel's
``<state>_tape`` parameters, allocated at launch: :class:`Tape`), and each reverse
iteration reads it back. Where the tape would exceed its memory budget (a large state,
an attention accumulator, over many programs), it keeps every ``k``-th iteration's state
(checkpoints), and a reverse iteration re-runs at most ``k - 1`` iterations from its
checkpoint. Without a tape (a carried pointer, a state of rank above 2), each reverse
iteration rebuilds the state from the loop's entry, quadratic in the trip count. The
comment in the derived kernel says which.
"""

from __future__ import annotations

import ast
import copy
import os
from dataclasses import dataclass, field, replace

from ..analysis.addresses import LoopIndex
from ..analysis.analyze import Analysis
from ..analysis.conditions import UNKNOWN_TRIP, Expr, LaunchValues
from ..core.device import cuda_properties
from ..core.ir import (
    Op,
    Origin,
    Tag,
    address_names,
    arguments,
    assign,
    child_blocks,
    copy_structured,
    header,
    is_structured,
    loops,
    name_node,
    op_of,
    range_bounds,
    reads,
    refuse,
    statements,
    structured,
    target_of,
    value_args,
    where,
)
from ..core.operations import OPERATIONS, instantiate


@dataclass
class LoopPlan:
    node: ast.For
    accumulators: dict[str, set[str]] = field(default_factory=dict)  # carried name -> its chain of partial sums
    recomputed: list[str] = field(default_factory=list)  # carried names re-run in the reverse loop
    nonlinear: list[str] = field(default_factory=list)  # carried names whose adjoint changes every iteration
    why: str = ""  # what makes the first of them nonlinear
    comment: str = ""


TAPE_BUDGET = int(os.environ.get("TRITONGRAD_TAPE_BUDGET", 4 << 30))  # bytes a launch's state tapes may take
TAPE_SHARE = 16  # and at most this share of the device's memory (1/16)
MAX_SLOTS = 4096  # slots per program where the trip count is not known at launch


@dataclass(frozen=True)
class Tape:
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

    def holds(self, other: Tape) -> bool:
        """Whether it holds every state ``other`` does, of the same loop, shape and type."""
        mine = {k: v[1:] for k, v in self.held().items()}
        return self.key == other.key and all(mine.get(k) == v[1:] for k, v in other.held().items())

    def joined(self, other: Tape) -> Tape:
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


class NotLinear(Exception):
    def __init__(self, stmt: ast.stmt | None, why: str):
        super().__init__(why)
        self.stmt, self.why = stmt, why


def classify_loops(a: Analysis) -> dict[int, LoopPlan]:
    """Each loop's plan, by ``id`` of its ``for`` node."""
    plans: dict[int, LoopPlan] = {}
    for node in reversed(loops(a.program.body)):  # inner loops first: an outer chain may run through them
        plans[id(node)] = _classify(a, node, plans)
    return plans


def _classify(a: Analysis, node: ast.For, plans: dict[int, LoopPlan]) -> LoopPlan:
    plan = LoopPlan(node)
    _check_stores_follow_the_loop(a, node)
    active = [c for c in node.tg.carried if c.name in a.active]
    state = _depends_on(node, {c.name for c in active})
    for c in node.tg.carried:
        if c.name not in a.active:
            plan.recomputed.append(c.name)
            continue
        try:
            plan.accumulators[c.name] = _linear_chain(a, node, c, state, plans)
        except NotLinear as e:
            plan.nonlinear.append(c.name)
            if not plan.why:
                culprit = f" in `{where(e.stmt).text}`" if e.stmt is not None else ""
                plan.why = f"{c.source}: {e.why}{culprit}"
    plan.comment = _comment(node, plan)
    return plan


def _check_stores_follow_the_loop(a: Analysis, node: ast.For) -> None:
    """A store to an output inside the loop must move with the iterations: one that writes the same
    addresses twice keeps only the last value, and the gradient belongs to that value alone. The
    address must be an affine form (addresses.py) in the loop index, or in carried state advanced by a fixed
    amount each iteration; lanes.py has checked that its stride keeps iterations apart."""
    roots = {node.target.id, *(c.name for c in node.tg.carried)}
    coordinate = LoopIndex(node.target.id)
    for s in statements(node.body):
        if op_of(s).kind not in ("store", "desc_store"):
            continue
        if a.pointer_base.get(arguments(s)["pointer"].id) not in a.outputs:
            continue
        addresses = address_names(s)
        if not any(coordinate in a.forms[n].coefficients for n in addresses if n in a.forms):
            what = ("at addresses that may repeat between iterations"
                    if any(n in _depends_on(node, roots) for n in addresses)
                    else "to the same addresses in every iteration")
            raise refuse(where(s), f"a tl.store inside the loop over `{node.target.id}` {what} "
                         "(only the last value stays)",
                         "store after the loop, or offset the address by the loop index times a stride")


def _depends_on(node: ast.For, roots: set[str], through: set[str] | None = None) -> set[str]:
    """Names in the loop whose values depend on ``roots`` (through the operations ``through``, or any
    operation and the tests of branches)."""
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for s in statements(node.body):
            t = target_of(s)
            if t is None or t in found or (through is not None and op_of(s).kind not in through):
                continue
            if any(n in found for n in value_args(s)):
                found.add(t)
                changed = True
        for inner in structured(node.body):  # values assigned under a test that depends on them
            if through is None and isinstance(inner, ast.If) and reads(inner.test) & found:
                for s in statements([inner]):
                    t = target_of(s)
                    if t is not None and t not in found:
                        found.add(t)
                        changed = True
    return found


def _linear_chain(a: Analysis, node: ast.For, c, state: set[str], plans: dict[int, LoopPlan]) -> set[str]:
    """The names holding ``c`` plus partial sums, if ``c`` is a linear accumulator; else NotLinear."""
    chain = {c.name}

    def walk(block: list[ast.stmt]) -> None:
        for s in block:
            for e in header(s):
                if reads(e) & chain:
                    raise NotLinear(s, "a branch or loop bound reads it")
            if isinstance(s, ast.For):
                inner = plans[id(s)]
                for ic in s.tg.carried:  # an inner loop adds to it: fine if linear there too
                    if ic.name in chain:
                        if ic.name not in inner.accumulators:
                            raise NotLinear(s, "an inner loop carries it nonlinearly")
                        chain.update(inner.accumulators[ic.name])
                walk(s.body)
            elif isinstance(s, ast.If):
                walk(s.body)
                walk(s.orelse)
                for m in s.tg.merges:  # both branches must hand on a partial sum, or neither
                    defs = a.defs[m]
                    sums = [any(n in chain for n in value_args(d)) for d in defs]
                    if any(sums) and not all(sums):
                        raise NotLinear(defs[0], "one branch of an `if` replaces it")
            else:
                step(s)

    def step(s: ast.stmt) -> None:
        used = [n for n in value_args(s) if n in chain]
        kind, t = op_of(s).kind, target_of(s)
        if not used:
            if t in chain:  # `acc = f(i)`: the carried value is replaced, not added to
                raise NotLinear(s, "it is overwritten")
            return
        added = kind in ("copy", "add") or (kind == "sub" and _is(arguments(s)["a"], chain)) or (
            kind == "dot" and _is(arguments(s)["acc"], chain)) or (
            kind in ("to", "cast") and OPERATIONS[kind].adjoints["input"](arguments(s)) == "g")  # to a float type
        if t is None or len(used) > 1 or not added:
            raise NotLinear(s, "it is used other than by adding to it")
        if any(x in state for x in value_args(s) if x not in chain):
            raise NotLinear(s, "what is added to it reads a loop-carried value")
        chain.add(t)

    walk(node.body)
    if not _is(c.next, chain):
        raise NotLinear(None, "its next value is not itself plus something")
    return chain


def _is(atom: ast.expr | None, names: set[str]) -> bool:
    return isinstance(atom, ast.Name) and atom.id in names


def _comment(node: ast.For, plan: LoopPlan) -> str:
    note = f"{node.tg.note}.\n" if node.tg.note else ""
    return note + _strategy(node, plan)


def _strategy(node: ast.For, plan: LoopPlan) -> str:
    index = node.target.id
    parts = []
    if plan.accumulators:
        names = ", ".join(c.source for c in node.tg.carried if c.name in plan.accumulators)
        verb, adjoint = ("is", "its adjoint is") if len(plan.accumulators) == 1 else ("are", "their adjoints are")
        parts.append(f"{names} {verb} accumulated linearly, so {adjoint} the same in every iteration")
    if plan.recomputed:
        names = ", ".join(c.source for c in node.tg.carried if c.name in plan.recomputed)
        parts.append(f"{names} {'is' if len(plan.recomputed) == 1 else 'are'} updated as in the forward")
    if not parts and not plan.nonlinear:
        parts.append("no state is carried between iterations")
    if plan.nonlinear:
        names = ", ".join(c.source for c in node.tg.carried if c.name in plan.nonlinear)
        parts.insert(0, f"{names} {'is' if len(plan.nonlinear) == 1 else 'are'} carried nonlinearly ({plan.why})")
        return f"loop over {index}: {'; '.join(parts)}."
    return (f"loop over {index}: {'; '.join(parts)}.\n"
            "The reverse loop runs the same iterations, each recomputed before its adjoints.")


class LoopReversal:
    """A ``for`` reversed as its plan says, written into a :class:`sweep.BackwardBuilder`'s sweep."""

    def __init__(self, builder):
        self.builder = builder  # the sweep this writes loops into (sweep.BackwardBuilder)

    def reverse_for(self, node: ast.For) -> None:
        plan = self.builder.loop_plans[id(node)]
        for name, chain in plan.accumulators.items():  # every partial sum shares the final value's adjoint
            self.ensure_adjoint(node, name)
            for n in chain:
                self.builder.adjoint[n] = self.builder.adjoint[name]
            self.builder.suppressed |= chain
        carried = {c.name: c for c in node.tg.carried}
        updates = [s for s in node.body if target_of(s) in carried]  # the statements that end the body
        incoming = {}
        for name in plan.nonlinear:  # the adjoint of the state after the iteration being reversed
            incoming[name] = self.builder.namer.fresh(f"{self.ensure_adjoint(node, name)}_next")
            for s in updates:
                if target_of(s) == name:
                    self.builder.g_override[id(s)] = incoming[name]
        pre: list[ast.stmt] = []
        sweep = self.builder.reverse_nested(node.body, pre)
        if not sweep:
            return
        # the state's updates are followed only when the reverse loop advances the state itself
        needed = self.builder.needed(node.body, sweep, carried, follow=() if plan.nonlinear else carried)
        if not plan.nonlinear:
            self.builder.comment(plan.comment)
            for p in pre:
                self.builder.emit(p)
            self.recomputing_loop(node, plan, sweep, needed, updates)
            return
        carried = {c.name: c for c in node.tg.carried}
        rebuilt = self.builder.closure({n for n in carried if n in needed}, node.body, carried)
        state = [carried[n] for n in carried if n in rebuilt]
        self.check_state(node, plan, state)
        untaped = self.untaped(state)
        how = REBUILT.format(untaped) if untaped is not None else SAVED if self.builder.saved else TAPED
        self.builder.comment(plan.comment + "\n" + how)
        for p in pre:
            self.builder.emit(p)
        if untaped is None:
            self.taped_loop(node, sweep, needed, updates, incoming, rebuilt, state)
        else:
            self.rebuilding_loop(node, sweep, needed, updates, incoming, rebuilt, state)

    def recomputing_loop(self, node: ast.For, plan, sweep, needed, updates) -> None:
        """The same iterations in the same order: recompute, adjoints, then advance the state."""
        carried = {c.name: c for c in node.tg.carried}
        state = [carried[n] for n in carried if n in needed]
        self.check_state(node, plan, state)
        body = self.builder.replay_block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        for s in updates:
            if target_of(s) in needed:
                body += self.builder.with_shadow(copy.deepcopy(s))
        for s in self.resets(node, state):
            self.builder.emit(s)
        self.builder.emit(copy_structured(node, target=copy.deepcopy(node.target), iter=copy.deepcopy(node.iter),
                                   body=body))

    def untaped(self, state) -> str | None:
        """Why the carried state cannot be kept on a tape (None: it can): a pointer, or a tile of rank above 2."""
        if self.builder.tile:
            return "a tile function's vector-Jacobian product has no memory of its own"
        for c in state:
            if c.name in self.builder.analysis.pointer_base:
                return f"{c.source} is a pointer"
            shape = self.builder.analysis.shapes.get(c.name)
            if shape is None or len(shape) > 2:
                return f"{c.source}'s shape is not known" if shape is None else f"{c.source} has rank {len(shape)}"
        return None

    def taped_loop(self, node: ast.For, sweep, needed, updates, incoming, rebuilt, state) -> None:
        """The iterations in reverse order, each starting from the state a first pass kept on a tape (a
        checkpoint every ``every`` iterations, and the iterations since re-run, where the tape has fewer slots
        than the loop has iterations). Where the forward kept the tape (``self.builder.saved``: augment.py), a slot per
        iteration and one for the state after the loop, there is no first pass."""
        index = node.target.id
        start, _, step = range_bounds(node)
        trips, back, now, i, every, slots, slot = (self.builder.namer.fresh(f"{index}_{w}") for w in (
            "trips", "back", "now", "i", "every", "slots", "slot"))
        params = {c.name: self.builder.namer.fresh(f"{c.name}_tape") for c in state}
        rows = {c.name: self.builder.namer.fresh(f"{c.name}_tape_row") for c in state}
        shapes = self.builder.analysis.shapes
        self.builder.tapes.append(Tape(slots, tuple((params[c.name], shapes[c.name]) for c in state),
                                       self._known_trips(node), node.tg.where, tuple(c.source for c in state),
                                       dtypes=tuple(self.dtype_as_written(c.name) for c in state)))
        names = {"start": start, "step": step, "every": name_node(every), "slots": name_node(slots),
                 "trips": name_node(trips), "i": name_node(i), "back": name_node(back), "slot": name_node(slot),
                 "index": name_node(index)}
        setup = [assign(trips, self.trip_count(node))]
        if not self.builder.saved:
            setup.append(assign(every, instantiate("tl.maximum(tl.cdiv(trips, slots), 1)", names)))
        setup += self.resets(node, state)
        setup += [assign(rows[c.name], instantiate(f"tg.{tape_row(self.dtype_as_written(c.name))}(tape, x, slots, "
                                                   "tg.program_index())", {
            **names, "tape": name_node(params[c.name]), "x": name_node(c.name)})) for c in state]
        for s in setup:
            s.tape_setup = node.tg  # merge_records moves them with the recording loop
            self.builder.emit(s)
        gets = "tg.tape_get(row, slot, x)"
        if self.builder.saved:  # the state after the loop, for what follows it (merge_records: in place of its replay)
            for c in state:
                final = assign(c.name, instantiate(gets, {
                    "row": name_node(rows[c.name]), "slot": name_node(trips), "x": name_node(c.name)}))
                final.tape_final = node.tg
                self.builder.emit(final)
        else:
            counted = "index" if _is_one(step) and _is_zero(start) else "index - start" if _is_one(step) else \
                "(index - start) // step"
            record = [assign(i, instantiate(counted, names))]
            record += [ast.Expr(instantiate("tg.tape_put(row, i // every, x, i % every == 0)", {
                **names, "row": name_node(rows[c.name]), "x": name_node(c.name)})) for c in state]
            puts = len(record)  # the iteration's number and its tape_puts, before the replayed body
            record += self.builder.replay_block(node.body, rebuilt)
            recording = copy_structured(node, target=copy.deepcopy(node.target), iter=copy.deepcopy(node.iter),
                                        body=record)
            recording.tape_puts = puts  # merge_records reads it
            self.builder.emit(recording)
        body = [assign(i, instantiate("trips - 1 - back", names))]
        if not self.builder.saved:
            body.append(assign(slot, instantiate("i // every", names)))
        body += [assign(c.name, instantiate(gets, {
            **names, "row": name_node(rows[c.name]), "slot": name_node(i if self.builder.saved else slot),
            "x": name_node(c.name)})) for c in state]
        if not self.builder.saved:
            replay = self.builder.replay_block(node.body, rebuilt)
            since = instantiate("start + slot * every * step", names)
            body += self.partial_replay(node, replay, since, instantiate("start + i * step", names))
        body.append(assign(index, instantiate("start + i * step", names)))
        self.emit_backwards(node, back, trips, body, sweep, needed, updates, incoming)

    def _known_trips(self, node: ast.For) -> Expr | None:
        trips = self.builder.analysis.trips.get(LoopIndex(node.target.id))
        return None if trips is None or trips == Expr.const(UNKNOWN_TRIP) else trips

    def trip_count(self, node: ast.For) -> ast.expr:
        start, stop, step = range_bounds(node)
        positive = isinstance(step, ast.Constant) and isinstance(step.value, int) and step.value > 0
        count = ("stop - start" if _is_one(step) else "tl.cdiv(stop - start, step)" if positive
                 else "tg.trip_count(start, stop, step)")  # a step whose sign is known at compile time only
        return instantiate(count, {"start": start, "stop": stop, "step": step})

    def partial_replay(self, node: ast.For, replay: list[ast.stmt], since: ast.expr, until: ast.expr
                       ) -> list[ast.stmt]:
        """The forward's iterations from index ``since`` up to ``until`` (excluded), as the forward writes them."""
        if not replay:
            return []
        start, _, step = range_bounds(node)
        iterator = copy.deepcopy(node.iter)
        args = [since, until, copy.deepcopy(step)]
        if _is_one(step):  # as the forward would write it
            args = args[1:2] if isinstance(since, ast.Constant) and since.value == 0 else args[:2]
        iterator.args = args
        iterator.keywords = [k for k in iterator.keywords if k.arg not in ("arg1", "arg2", "step")]
        return [copy_structured(node, target=copy.deepcopy(node.target), iter=iterator, body=replay)]

    def next_adjoints(self, incoming: dict[str, str]) -> list[ast.stmt]:
        """This iteration's update gets the adjoint carried so far; what flows into the state it started
        from is collected afresh."""
        out = []
        for name, d_next in incoming.items():
            d = self.builder.adjoint[name]
            out.append(assign(d_next, name_node(d)))
            out.append(assign(d, instantiate("tl.zeros_like(d)", {"d": name_node(d)})))
        return out

    def rebuilding_loop(self, node: ast.For, sweep, needed, updates, incoming, rebuilt, state) -> None:
        """The iterations in reverse order; each first rebuilds the carried state it starts from by
        re-running the iterations before it from the loop's entry (quadratic in the trip count)."""
        index = node.target.id
        start, _, step = range_bounds(node)
        trips, back, now = (self.builder.namer.fresh(f"{index}_{w}") for w in ("trips", "back", "now"))
        bounds = {"start": start, "step": step, "trips": name_node(trips), "back": name_node(back)}
        self.builder.emit(assign(trips, self.trip_count(node)))
        body: list[ast.stmt] = [assign(now, instantiate("start + (trips - 1 - back) * step", bounds))]
        body += self.resets(node, state)
        replayed = self.builder.replay_block(node.body, rebuilt)
        body += self.partial_replay(node, replayed, copy.deepcopy(start), name_node(now))
        body.append(assign(index, name_node(now)))
        self.emit_backwards(node, back, trips, body, sweep, needed, updates, incoming)

    def emit_backwards(self, node: ast.For, back: str, trips: str, body, sweep, needed, updates, incoming) -> None:
        """The reverse loop ``for back in range(trips)``: ``body`` (the iteration's state and index), then
        the adjoints carried in, the iteration's values and its sweep."""
        body += self.next_adjoints(incoming)
        body += self.builder.replay_block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        func = "tl.static_range" if node.tg.static else "range"
        loop = ast.For(target=ast.Name(back, ast.Store()), iter=instantiate(f"{func}(trips)", {"trips": name_node(
            trips)}), body=body, orelse=[])
        self.builder.emit(ast.copy_location(loop, node))

    def ensure_adjoint(self, node: ast.For, name: str) -> str:
        """The adjoint of a loop's carried variable before its reversal (zero when nothing reached it)."""
        if name not in self.builder.adjoint:
            self.builder.adjoint[name] = self.builder.adjoint_name(name)
            like = name_node(name)
            init = next(c.init for c in node.tg.carried if c.name == name)
            if isinstance(init, ast.Name) and init.id != name:  # its type without replaying the loop
                like = copy.deepcopy(init)
            self.builder.emit(ast.Assign(targets=[ast.Name(self.builder.adjoint[name], ast.Store())],
                                 value=instantiate("tg.zeros_grad(x)", {"x": like})))
        return self.builder.adjoint[name]

    def check_state(self, node: ast.For, plan, state) -> None:
        for c in state:
            if c.name in plan.accumulators:  # loops.py promised its value is not needed
                raise refuse(where(node), f"the loop over `{node.target.id}`: `{c.source}`'s value at each "
                             "iteration is needed", "use the accumulator for accumulating only")

    def resets(self, node: ast.For, state) -> list[ast.stmt]:
        """The carried state back to its value at the loop's entry."""
        out = []
        for c in state:
            if isinstance(c.init, ast.Name) and c.init.id == c.name:  # assigned before the loop: again
                reset = copy.deepcopy(next(d for d in self.builder.defs[c.name] if not self.inside(d, node)))
            else:
                reset = ast.Assign(targets=[ast.Name(c.name, ast.Store())], value=copy.deepcopy(c.init))
                reset.tg = Tag(Op("copy", [c.init]), node.tg.origin, node.tg.where)
            out += self.builder.with_shadow(reset)
        return out

    def keep_finals(self, *segments: list[ast.stmt]) -> None:
        """Where the backward replays a loop (not nested in another, its state not taped) for the values it
        leaves, the forward can keep those instead (augment.py: a tape of one slot, ``Tape.final``): the variant
        built for the forward's tapes (``self.builder.saved``) reads them in place of the replay, and lists them among
        its tapes (``BackwardKernel.saved_tapes`` tells the forward). ``segments``: consecutive parts of the body."""
        if not self.builder.saved:
            return
        replays = [(block, s) for segment in segments for block, s in _replayed_loops(segment)]
        for block, replay in replays:
            forward = replay.replay_of
            carried = {c.name: c for c in forward.tg.carried}
            read_after = set().union(*(_reads_outside(segment, replay) for segment in segments))
            kept = [n for n in carried if n in read_after and n in {target_of(s) for s in statements(replay.body)}]
            shapes = [self.builder.analysis.shapes.get(n) for n in kept]
            if (not kept or self.builder.loop_plans[id(forward)].nonlinear or self.builder.tile
                    or any(n in self.builder.analysis.pointer_base for n in kept)
                    or any(shape is None or len(shape) > 2 for shape in shapes)):
                continue
            slots = self.builder.namer.fresh(f"{forward.target.id}_final_slots")
            params = {n: self.builder.namer.fresh(f"{n}_final") for n in kept}
            states = tuple((params[n], shape) for n, shape in zip(kept, shapes, strict=True))
            sources = tuple(carried[n].source for n in kept)
            self.builder.tapes.append(Tape(slots, states, None, forward.tg.where, sources, final=True,
                                           dtypes=tuple(self.dtype_as_written(n) for n in kept)))
            rows = {n: self.builder.namer.fresh(f"{n}_final_row") for n in kept}
            program = assign(self.builder.namer.fresh("program"), instantiate("tg.program_index()", {}))
            # the row of the forward's program (a backward looping over them says which: persistent.py)
            program.tg = Tag(Op("program_index", []), forward.tg.origin, forward.tg.where)
            read = [program]
            read += [assign(rows[n], instantiate(f"tg.{tape_row(self.dtype_as_written(n))}(tape, x, slots, program)", {
                "tape": name_node(params[n]), "x": name_node(n), "slots": name_node(slots),
                "program": name_node(program.targets[0].id)})) for n in kept]
            read += [assign(n, instantiate("tg.tape_get(row, 0, x)", {
                "row": name_node(rows[n]), "x": name_node(n)})) for n in kept]
            at = block.index(replay)
            block[at:at + 1] = read

    def dtype_as_written(self, name: str) -> str | None:
        """The dtype a loop's carried value is created with before the loop (a carried value keeps its type),
        as written: ``tl.zeros([BM], dtype=COMPUTE)`` gives ``COMPUTE``; followed through copies."""
        seen = set()
        while name not in seen and self.builder.analysis.defs.get(name):
            seen.add(name)
            first = self.builder.analysis.defs[name][0]
            op = op_of(first)
            if op.kind in ("zeros", "full"):  # zeros(shape, dtype), full(shape, value, dtype)
                at = 1 if op.kind == "zeros" else 2
                dtype = op.kwargs.get("dtype", op.args[at] if len(op.args) > at else None)
                return ast.unparse(dtype) if isinstance(dtype, (ast.Name, ast.Attribute)) else None
            if op.kind != "copy" or not isinstance(op.args[0], ast.Name):
                return None
            name = op.args[0].id
        return None

    def inside(self, stmt: ast.stmt, node: ast.stmt) -> bool:
        return any(e is node for e in self.builder.enclosing[id(stmt)])


TAPED = ("A first pass keeps the state at the start of each iteration on a tape (every k-th where the tape\n"
         "would exceed its budget: then the iterations since are re-run); the reverse loop runs the iterations\n"
         "backwards from it: linear in the trip count.")
SAVED = ("The forward kept the state at the start of each iteration, and after the last, on a tape (augment.py);\n"
         "the reverse loop runs the iterations backwards from it: linear in the trip count, no pass before it.")
REBUILT = ("The reverse loop runs the iterations backwards, each first rebuilding the state it starts from\n"
           "by re-running the iterations before it (quadratic in the trip count: no tape, {}).")


def merge_records(*segments: list[ast.stmt]) -> None:
    """Where a block replays a taped loop (its final state is read after it) before the pass that records the
    loop's tape, the replay records it: one pass over the loop instead of two. Where the forward kept the tape,
    the state read from its last slot takes the replay's place, when the replay computes nothing else that
    outlives the loop. ``segments``: consecutive parts of one block (the replay in front of the sweep, the
    sweep); blocks inside them are merged too."""
    for segment in segments:
        for s in segment:
            for block in child_blocks(s):
                merge_records(block)
    flat = [(segment, s) for segment in segments for s in segment]
    for position, (segment, record) in enumerate(flat):
        final = getattr(record, "tape_final", None)
        if not (isinstance(record, ast.For) and getattr(record, "tape_puts", 0)) and final is None:
            continue
        tg = final or record.tg
        earlier = [(seg, s) for seg, s in flat[:position] if isinstance(s, ast.For)
                   and getattr(s, "tg", None) is tg and not getattr(s, "tape_puts", 0)]
        if not earlier:
            continue
        home, replay = earlier[-1]
        assigned = {target_of(s) for s in statements(replay.body)}
        carried = {c.name for c in tg.carried}
        setup = [s for s in segment if getattr(s, "tape_setup", None) is tg]
        if final is not None:  # the forward's tape holds the state after the loop
            finals = [s for s in segment if getattr(s, "tape_final", None) is tg]
            if not carried & assigned <= {target_of(s) for s in finals}:
                continue
            moved = [*setup, *finals]
        else:
            state = {target_of(s) for s in record.body[record.tape_puts:]} - {None}
            if not (state & carried) <= assigned:
                continue
            record.body = record.body[:record.tape_puts] + replay.body
            moved = [*setup, record]
        for s in moved:
            segment.remove(s)
            s.tape_setup = s.tape_final = None  # merged: not looked at again
        at = home.index(replay)
        home[at:at + 1] = moved
        merge_records(*segments)  # positions moved: look again
        return


def _replayed_loops(block: list[ast.stmt]):
    """(block, loop) for each replay of a forward loop (``replay_of``: reverse.py marks them) in ``block``."""
    for s in block:
        if isinstance(s, ast.For) and getattr(s, "replay_of", None) is not None:
            yield block, s
        elif is_structured(s):
            for inner in child_blocks(s):
                yield from _replayed_loops(inner)


def _reads_outside(block: list[ast.stmt], skipped: ast.stmt) -> set[str]:
    """Names read in ``block`` outside the statement ``skipped``."""
    found: set[str] = set()
    for s in block:
        if s is skipped:
            continue
        if is_structured(s):
            found |= reads(s.test if isinstance(s, ast.If) else s.iter)
            for inner in child_blocks(s):
                found |= _reads_outside(inner, skipped)
        else:
            found |= reads(s)
    return found




def _is_zero(start: ast.expr) -> bool:
    return isinstance(start, ast.Constant) and start.value == 0 and type(start.value) is int


def _is_one(step: ast.expr) -> bool:
    return isinstance(step, ast.Constant) and step.value == 1 and type(step.value) is int

