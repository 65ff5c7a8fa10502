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
``<state>_tape`` parameters, allocated at launch: :class:`StateTape`), and each reverse
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

from ..analysis.forms import LoopIndex
from ..analysis.launch_values import UNKNOWN_TRIP, Expr
from ..analysis.value_types import value_type
from ..core.ir import (
    Op,
    Tag,
    assign,
    child_blocks,
    construct_origin,
    copy_structured,
    is_structured,
    name_node,
    range_bounds,
    reads,
    refuse,
    statements,
    target_of,
)
from ..core.operations import instantiate
from .interchange import fixed_step
from .state_tape import StateTape, tape_get, tape_row


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
        rebuilt = self.builder.forward.closure({n for n in carried if n in needed}, node.body, carried)
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
        """The same iterations in the same order: recomputed, adjoints, then advance the state."""
        carried = {c.name: c for c in node.tg.carried}
        state = [carried[n] for n in carried if n in needed]
        self.check_state(node, plan, state)
        body = self.builder.forward.block(node.body, needed, skip={id(s) for s in updates})
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
        static = node.tg.static  # its recomputations' bounds must be constexprs: so are the slot count and the spacing
        self.builder.tapes.append(StateTape(slots, tuple((params[c.name], shapes[c.name]) for c in state),
                                       self._known_trips(node), node.tg.where, tuple(c.source for c in state),
                                       dtypes=tuple(self.state_type(c.name) for c in state), constexpr_slots=static))
        names = {"start": start, "step": step, "every": name_node(every), "slots": name_node(slots),
                 "trips": name_node(trips), "i": name_node(i), "back": name_node(back), "slot": name_node(slot),
                 "index": name_node(index)}
        setup, names["trips"] = self.counted(node, trips, self.trip_count(node))
        if not self.builder.saved:  # (constexpr arithmetic for a static loop: slots >= 1, and none is read at 0 trips)
            spacing, names["every"] = self.counted(node, every, instantiate(
                "(trips + slots - 1) // slots" if static else "tl.maximum(tl.cdiv(trips, slots), 1)", names))
            setup += spacing
        setup += self.resets(node, state)
        setup += [assign(rows[c.name], tape_row(self.state_type(c.name), name_node(params[c.name]), name_node(c.name),
                                                name_node(slots), instantiate("tg.program_index()", {})))
                  for c in state]
        for s in setup:
            s.tape_setup = node.tg  # merge_records moves them with the recording loop
            self.builder.emit(s)
        if self.builder.saved:  # the state after the loop, for what follows it (merge_records: in place of recomputing)
            for c in state:
                final = assign(c.name, tape_get(self.state_type(c.name), name_node(rows[c.name]),
                                                copy.deepcopy(names["trips"]), name_node(c.name)))
                final.tape_final = node.tg
                self.builder.emit(final)
        else:
            counted = "index" if _is_one(step) and _is_zero(start) else "index - start" if _is_one(step) else \
                "(index - start) // step"
            record = [assign(i, instantiate(counted, names))]
            record += [ast.Expr(instantiate("tg.tape_put(row, i // every, x, i % every == 0)", {
                **names, "row": name_node(rows[c.name]), "x": name_node(c.name)})) for c in state]
            puts = len(record)  # the iteration's number and its tape_puts, before the recomputed body
            record += self.builder.forward.block(node.body, rebuilt)
            recording = copy_structured(node, target=copy.deepcopy(node.target), iter=copy.deepcopy(node.iter),
                                        body=record)
            recording.tape_puts = puts  # merge_records reads it
            self.builder.emit(recording)
        body = [assign(i, instantiate("trips - 1 - back", names))]
        if not self.builder.saved:
            body.append(assign(slot, instantiate("i // every", names)))
        body += [assign(c.name, tape_get(self.state_type(c.name), name_node(rows[c.name]),
                                         name_node(i if self.builder.saved else slot), name_node(c.name)))
                 for c in state]
        if not self.builder.saved:
            recomputed = self.builder.forward.block(node.body, rebuilt)
            # a static loop's iteration and slot said inline, constexprs (a name assigned in its body is a tensor)
            now = "(trips - 1 - back)" if static else "i"
            since = instantiate(f"start + {now} // every * every * step" if static else "start + slot * every * step",
                                names)
            body += self.partial_recompute(node, recomputed, since, instantiate(f"start + {now} * step", names))
        body.append(assign(index, instantiate("start + i * step", names)))
        self.emit_backwards(node, back, names["trips"], body, sweep, needed, updates, incoming)

    def _known_trips(self, node: ast.For) -> Expr | None:
        trips = self.builder.analysis.trips.get(LoopIndex(node.target.id))
        return None if trips is None or trips == Expr.const(UNKNOWN_TRIP) else trips

    def trip_count(self, node: ast.For) -> ast.expr:
        start, stop, step = range_bounds(node)
        literal = _int_literal(step)
        if literal is not None and literal > 0:
            count = "stop - start" if literal == 1 else "tl.cdiv(stop - start, step)"
        elif not node.tg.static:
            count = "tg.trip_count(start, stop, step)"  # a step whose sign is known at compile time only
        elif literal is not None:  # a static loop's count a constexpr, as its reverse loop's bound must be (compiled,
            count = "start - stop" if literal == -1 else "tl.cdiv(start - stop, -step)"  # a helper's result is not)
        else:
            count = "tl.cdiv(stop - start, step) if step > 0 else tl.cdiv(start - stop, -step)"
        return instantiate(count, {"start": start, "stop": stop, "step": step})

    def partial_recompute(self, node: ast.For, recomputed: list[ast.stmt], since: ast.expr, until: ast.expr
                       ) -> list[ast.stmt]:
        """The forward's iterations from index ``since`` up to ``until`` (excluded), as the forward writes them."""
        if not recomputed:
            return []
        start, _, step = range_bounds(node)
        iterator = copy.deepcopy(node.iter)
        args = [since, until, copy.deepcopy(step)]
        if _is_one(step):  # as the forward would write it
            args = args[1:2] if isinstance(since, ast.Constant) and since.value == 0 else args[:2]
        iterator.args = args
        iterator.keywords = [k for k in iterator.keywords if k.arg not in ("arg1", "arg2", "step")]
        return [copy_structured(node, target=copy.deepcopy(node.target), iter=iterator, body=recomputed)]

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
        count, counted = self.counted(node, trips, self.trip_count(node))
        bounds = {"start": start, "step": step, "trips": counted, "back": name_node(back)}
        for s in count:
            self.builder.emit(s)
        current = instantiate("start + (trips - 1 - back) * step", bounds)
        body: list[ast.stmt] = []
        if not node.tg.static:  # (a static loop's index is said inline: a constexpr, as a recomputation's bound is)
            body.append(assign(now, current))
            current = name_node(now)
        body += self.resets(node, state)
        recomputed = self.builder.forward.block(node.body, rebuilt)
        body += self.partial_recompute(node, recomputed, copy.deepcopy(start), copy.deepcopy(current))
        body.append(assign(index, current))
        self.emit_backwards(node, back, counted, body, sweep, needed, updates, incoming)

    @staticmethod
    def counted(node: ast.For, name: str, value: ast.expr) -> tuple[list[ast.stmt], ast.expr]:
        """A count the reverse loop reads (its trips, its checkpoint spacing): ``name = value`` and ``name``; for a
        ``tl.static_range`` loop no statement and ``value`` itself, said inline where it is read: its reverse loop
        and recomputations take it as a bound, which compiled must be a constexpr (a name assigned a constexpr's value
        is not one), and an annotated ``name: tl.constexpr = value`` would be assigned again in each unrolled copy
        of an enclosing static loop, which compiled Triton refuses ('constexpr cannot be reassigned')."""
        if not node.tg.static:
            return [assign(name, value)], name_node(name)
        return [], value

    def emit_backwards(self, node: ast.For, back: str, trips: ast.expr, body, sweep, needed, updates, incoming
                       ) -> None:
        """The reverse loop ``for back in range(trips)``: ``body`` (the iteration's state and index), then
        the adjoints carried in, the iteration's values and its sweep. A carried adjoint enters in its state's type
        (the gradient reaching it may be narrower: a float32 loss of float64 state), which the loop keeps when
        compiled."""
        for name in incoming:
            kind = self.state_type(name)
            if kind is not None and name in self.builder.adjoint:
                d = self.builder.adjoint[name]
                self.builder.emit(assign(d, instantiate("tl.cast(d, kind)", {
                    "d": name_node(d), "kind": ast.parse(kind, mode="eval").body})))
        body += self.next_adjoints(incoming)
        body += self.builder.forward.block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        func = "tl.static_range" if node.tg.static else "range"
        loop = ast.For(target=ast.Name(back, ast.Store()), iter=instantiate(f"{func}(trips)", {"trips": trips}),
                       body=body, orelse=[])
        self.builder.emit(ast.copy_location(loop, node))

    def ensure_adjoint(self, node: ast.For, name: str) -> str:
        """The adjoint of a loop's carried variable before its reversal (zero when nothing reached it)."""
        if name not in self.builder.adjoint:
            self.builder.adjoint[name] = self.builder.adjoint_name(name)
            like = name_node(name)
            init = next(c.init for c in node.tg.carried if c.name == name)
            if isinstance(init, ast.Name) and init.id != name:  # its type without recomputing the loop
                like = copy.deepcopy(init)
            self.builder.emit(ast.Assign(targets=[ast.Name(self.builder.adjoint[name], ast.Store())],
                                 value=instantiate("tg.zeros_grad(x)", {"x": like})))
        return self.builder.adjoint[name]

    def check_state(self, node: ast.For, plan, state) -> None:
        for c in state:
            if c.name in plan.accumulators:  # loops.py promised its value is not needed
                raise refuse(construct_origin(node), f"the loop over `{node.target.id}`: `{c.source}`'s value at each "
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
        """Where the backward recomputes a loop (not nested in another, its state not taped) for the values it
        leaves, the forward can keep those instead (augment.py: a tape of one slot, ``StateTape.final``): the variant
        built for the forward's tapes (``self.builder.saved``) reads them in place of the recomputation, and lists them
        among its tapes (``BackwardKernel.saved_tapes`` tells the forward). ``segments``: consecutive parts of the
        body."""
        if not self.builder.saved:
            return
        recomputations = [(block, s) for segment in segments for block, s in _recomputed_loops(segment)]
        for block, recomputed in recomputations:
            forward = recomputed.recompute_of
            carried = {c.name: c for c in forward.tg.carried}
            read_after = set().union(*(_reads_outside(segment, recomputed) for segment in segments))
            kept = [n for n in carried if n in read_after and n in {target_of(s) for s in statements(recomputed.body)}]
            shapes = [self.builder.analysis.shapes.get(n) for n in kept]
            if (not kept or self.builder.loop_plans[id(forward)].nonlinear or self.builder.tile
                    or any(n in self.builder.analysis.pointer_base for n in kept)
                    or any(shape is None or len(shape) > 2 for shape in shapes)):
                continue
            counted = {n: step for n in kept if (step := _fixed_step(recomputed.body, n)) is not None}
            closed = [assign(n, instantiate(f"x {sign} tl.maximum(trips, 0) * inc", {
                "x": carried[n].init, "trips": self.trip_count(recomputed), "inc": inc}))
                for n, (sign, inc) in counted.items()]  # (a counter's final value needs no tape)
            kept = [n for n in kept if n not in counted]
            shapes = [self.builder.analysis.shapes.get(n) for n in kept]
            if not kept:
                at = block.index(recomputed)
                block[at:at + 1] = closed
                continue
            slots = self.builder.namer.fresh(f"{forward.target.id}_final_slots")
            params = {n: self.builder.namer.fresh(f"{n}_final") for n in kept}
            states = tuple((params[n], shape) for n, shape in zip(kept, shapes, strict=True))
            sources = tuple(carried[n].source for n in kept)
            self.builder.tapes.append(StateTape(slots, states, None, forward.tg.where, sources, final=True,
                                           dtypes=tuple(self.state_type(n) for n in kept)))
            rows = {n: self.builder.namer.fresh(f"{n}_final_row") for n in kept}
            program = assign(self.builder.namer.fresh("program"), instantiate("tg.program_index()", {}))
            # the row of the forward's program (a backward looping over them says which: persistent.py)
            program.tg = Tag(Op("program_index", []), forward.tg.origin, forward.tg.where)
            read = [program]
            read += [assign(rows[n], tape_row(self.state_type(n), name_node(params[n]), name_node(n), name_node(slots),
                                              name_node(program.targets[0].id))) for n in kept]
            read += [assign(n, tape_get(self.state_type(n), name_node(rows[n]), ast.Constant(0), name_node(n)))
                     for n in kept]
            at = block.index(recomputed)
            block[at:at + 1] = read + closed

    def state_type(self, name: str) -> str | None:
        """The type a value has as the forward computes it (a carried one: Triton's promotion of its start and its
        updates; analysis/value_types.py), spelled for the kernel; None where it cannot be said (then its tape is
        of the widest type). What keeps it (its state tape, the forward's kept finals, a prologue) keeps that."""
        analysis = self.builder.analysis
        return value_type(name, analysis.defs, analysis.pointer_base, set(analysis.program.param_names()),
                          analysis.program.constexprs)

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
    """Where a block recomputes a taped loop (its final state is read after it) before the pass that records the
    loop's tape, the recomputation records it: one pass over the loop instead of two. Where the forward kept the tape,
    the state read from its last slot takes the recomputation's place, when the recomputation computes nothing else that
    outlives the loop. ``segments``: consecutive parts of one block (the recomputation in front of the sweep, the
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
        home, recomputed = earlier[-1]
        assigned = {target_of(s) for s in statements(recomputed.body)}
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
            record.body = record.body[:record.tape_puts] + recomputed.body
            moved = [*setup, record]
        for s in moved:
            segment.remove(s)
            s.tape_setup = s.tape_final = None  # merged: not looked at again
        at = home.index(recomputed)
        home[at:at + 1] = moved
        merge_records(*segments)  # positions moved: look again
        return


def _fixed_step(body: list[ast.stmt], name: str) -> tuple[str, ast.expr] | None:
    """``(sign, inc)`` where the loop's body advances ``name`` by one top-level ``name = name + inc`` (``- inc``)
    and nothing else, ``inc`` a constant or a name the body does not assign: its value after the loop is its
    value before plus the trip count times ``inc``."""
    writes = [s for s in statements(body) if target_of(s) == name]
    if len(writes) != 1 or not any(s is writes[0] for s in body):
        return None
    step = fixed_step(writes[0], name)
    if step is None:
        return None
    sign, inc = step
    assigned = {target_of(s) for s in statements(body)}
    if not (isinstance(inc, ast.Constant) and isinstance(inc.value, int)) and not (
            isinstance(inc, ast.Name) and inc.id not in assigned):
        return None
    return sign, inc


def _recomputed_loops(block: list[ast.stmt]):
    """(block, loop) for each recomputation of a forward loop (``recompute_of``: sweep.py marks them) in ``block``."""
    for s in block:
        if isinstance(s, ast.For) and getattr(s, "recompute_of", None) is not None:
            yield block, s
        elif is_structured(s):
            for inner in child_blocks(s):
                yield from _recomputed_loops(inner)


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


def _int_literal(step: ast.expr) -> int | None:
    """A step written as an integer (``2``, ``-1``), else None."""
    if isinstance(step, ast.UnaryOp) and isinstance(step.op, ast.USub):
        inner = _int_literal(step.operand)
        return -inner if inner is not None else None
    return step.value if isinstance(step, ast.Constant) and type(step.value) is int else None


def _is_one(step: ast.expr) -> bool:
    return isinstance(step, ast.Constant) and step.value == 1 and type(step.value) is int

