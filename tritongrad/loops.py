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
the start of each. Each reverse iteration rebuilds it by re-running the forward
iterations before it from the loop's entry: correct for any loop over a range, at a
cost quadratic in the trip count (the comment in the derived kernel says so).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from .addresses import LoopIndex
from .analysis import Analysis
from .ir import (
    Op,
    Tag,
    address_names,
    arguments,
    copy_structured,
    header,
    loops,
    name_node,
    op_of,
    reads,
    refuse,
    statements,
    structured,
    target_of,
    value_args,
    where,
)
from .operations import OPERATIONS, instantiate


@dataclass
class LoopPlan:
    node: ast.For
    accumulators: dict[str, set[str]] = field(default_factory=dict)  # carried name -> its chain of partial sums
    recomputed: list[str] = field(default_factory=list)  # carried names re-run in the reverse loop
    nonlinear: list[str] = field(default_factory=list)  # carried names whose adjoint changes every iteration
    why: str = ""  # what makes the first of them nonlinear
    comment: str = ""


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
        return (f"loop over {index}: {'; '.join(parts)}.\n"
                "The reverse loop runs the iterations backwards, each first rebuilding the state it starts from\n"
                "by re-running the iterations before it (quadratic in the trip count).")
    return (f"loop over {index}: {'; '.join(parts)}.\n"
            "The reverse loop runs the same iterations, each recomputed before its adjoints.")


class LoopReversal:
    """The loop half of :class:`reverse.BackwardBuilder`: a ``for`` reversed as its plan says."""

    def reverse_for(self, node: ast.For) -> None:
        plan = self.loop_plans[id(node)]
        for name, chain in plan.accumulators.items():  # every partial sum shares the final value's adjoint
            self.ensure_adjoint(node, name)
            for n in chain:
                self.adjoint[n] = self.adjoint[name]
            self.suppressed |= chain
        carried = {c.name: c for c in node.tg.carried}
        updates = [s for s in node.body if target_of(s) in carried]  # the statements that end the body
        incoming = {}
        for name in plan.nonlinear:  # the adjoint of the state after the iteration being reversed
            incoming[name] = self.namer.fresh(f"{self.ensure_adjoint(node, name)}_next")
            for s in updates:
                if target_of(s) == name:
                    self.g_override[id(s)] = incoming[name]
        pre: list[ast.stmt] = []
        sweep = self.reverse_nested(node.body, pre)
        if not sweep:
            return
        # the state's updates are followed only when the reverse loop advances the state itself
        needed = self.needed(node.body, sweep, carried, follow=() if plan.nonlinear else carried)
        self.comment(plan.comment)
        for p in pre:
            self.emit(p)
        if plan.nonlinear:
            self.rebuilding_loop(node, plan, sweep, needed, updates, incoming)
        else:
            self.recomputing_loop(node, plan, sweep, needed, updates)

    def recomputing_loop(self, node: ast.For, plan, sweep, needed, updates) -> None:
        """The same iterations in the same order: recompute, adjoints, then advance the state."""
        carried = {c.name: c for c in node.tg.carried}
        state = [carried[n] for n in carried if n in needed]
        self.check_state(node, plan, state)
        body = self.replay_block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        for s in updates:
            if target_of(s) in needed:
                body += self.with_shadow(copy.deepcopy(s))
        for s in self.resets(node, state):
            self.emit(s)
        self.emit(copy_structured(node, target=copy.deepcopy(node.target), iter=copy.deepcopy(node.iter),
                                   body=body))

    def rebuilding_loop(self, node: ast.For, plan, sweep, needed, updates, incoming) -> None:
        """The iterations in reverse order; each first rebuilds the carried state it starts from by
        re-running the iterations before it from the loop's entry (quadratic in the trip count)."""
        carried = {c.name: c for c in node.tg.carried}
        rebuilt = self.closure({n for n in carried if n in needed}, node.body, carried)
        state = [carried[n] for n in carried if n in rebuilt]
        self.check_state(node, plan, state)
        index = node.target.id
        start, stop, step = _bounds(node)
        trips, back, now = (self.namer.fresh(f"{index}_{w}") for w in ("trips", "back", "now"))
        positive = isinstance(step, ast.Constant) and isinstance(step.value, int) and step.value > 0
        count = ("stop - start" if _is_one(step) else "tl.cdiv(stop - start, step)" if positive
                 else "tg.trip_count(start, stop, step)")  # a step whose sign is known at compile time only
        bounds = {"start": start, "stop": stop, "step": step, "trips": name_node(trips), "back": name_node(back)}
        self.emit(ast.Assign(targets=[ast.Name(trips, ast.Store())], value=instantiate(count, bounds)))
        body: list[ast.stmt] = [ast.Assign(targets=[ast.Name(now, ast.Store())],
                                           value=instantiate("start + (trips - 1 - back) * step", bounds))]
        body += self.resets(node, state)
        replay = self.replay_block(node.body, rebuilt)
        if replay:
            iterator = copy.deepcopy(node.iter)
            args = [copy.deepcopy(start), name_node(now), copy.deepcopy(step)]
            if _is_one(step):  # as the forward would write it
                args = args[1:2] if isinstance(start, ast.Constant) and start.value == 0 else args[:2]
            iterator.args = args
            iterator.keywords = [k for k in iterator.keywords if k.arg not in ("arg1", "arg2", "step")]
            body.append(copy_structured(node, target=copy.deepcopy(node.target), iter=iterator, body=replay))
        body.append(ast.Assign(targets=[ast.Name(index, ast.Store())], value=name_node(now)))
        for name, d_next in incoming.items():  # this iteration's update gets the adjoint carried so far;
            d = self.adjoint[name]  # what flows into the state it started from is collected afresh
            body.append(ast.Assign(targets=[ast.Name(d_next, ast.Store())], value=name_node(d)))
            body.append(ast.Assign(targets=[ast.Name(d, ast.Store())], value=instantiate("tl.zeros_like(d)", {
                "d": name_node(d)})))
        body += self.replay_block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        func = "tl.static_range" if node.tg.static else "range"
        loop = ast.For(target=ast.Name(back, ast.Store()), iter=instantiate(f"{func}(trips)", bounds), body=body,
                       orelse=[])
        self.emit(ast.copy_location(loop, node))

    def ensure_adjoint(self, node: ast.For, name: str) -> str:
        """The adjoint of a loop's carried variable before its reversal (zero when nothing reached it)."""
        if name not in self.adjoint:
            self.adjoint[name] = self.adjoint_name(name)
            like = name_node(name)
            init = next(c.init for c in node.tg.carried if c.name == name)
            if isinstance(init, ast.Name) and init.id != name:  # its type without replaying the loop
                like = copy.deepcopy(init)
            self.emit(ast.Assign(targets=[ast.Name(self.adjoint[name], ast.Store())],
                                 value=instantiate("tg.zeros_grad(x)", {"x": like})))
        return self.adjoint[name]

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
                reset = copy.deepcopy(next(d for d in self.defs[c.name] if not self.inside(d, node)))
            else:
                reset = ast.Assign(targets=[ast.Name(c.name, ast.Store())], value=copy.deepcopy(c.init))
                reset.tg = Tag(Op("copy", [c.init]), node.tg.origin, node.tg.where)
            out += self.with_shadow(reset)
        return out

    def inside(self, stmt: ast.stmt, node: ast.stmt) -> bool:
        return any(e is node for e in self.enclosing[id(stmt)])


def _bounds(node: ast.For) -> tuple[ast.expr, ast.expr, ast.expr]:
    """A loop's start, stop and step, as range() reads its arguments."""
    args = list(node.iter.args)
    named = {k.arg: k.value for k in node.iter.keywords}
    args += [named[k] for k in ("arg1", "arg2") if k in named]
    if len(args) == 1:
        return ast.Constant(0), args[0], named.get("step", ast.Constant(1))
    step = args[2] if len(args) > 2 else named.get("step", ast.Constant(1))
    return args[0], args[1], step


def _is_one(step: ast.expr) -> bool:
    return isinstance(step, ast.Constant) and step.value == 1 and type(step.value) is int

